package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/backoff"
)

// EnsureCompactedTopic creates topic as a compacted topic with one partition
// when it does not exist, and refuses one that exists with more partitions
// (ErrCheckpointTopic): the read barrier (ReadCompacted) protects a read only
// on the partition it was written to, and with several partitions the
// barrier's key and the checkpoint's land on different ones. Its segments are small so that compaction keeps it
// short: it holds one small record per key that matters (a checkpoint).
func EnsureCompactedTopic(cfg Config, topic string) error {
	sc, err := cfg.Sarama()
	if err != nil {
		return err
	}
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		return fmt.Errorf("kafka: list topics: %w", err)
	}
	if d, ok := topics[topic]; ok {
		if d.NumPartitions > 1 {
			return fmt.Errorf("%w: the checkpoint topic %q has %d partitions; outboxd needs exactly 1, so that a session's read barrier and its checkpoints share a partition (a stale leader is noticed only there): point --checkpoint-topic at a new topic, which outboxd creates with one partition",
				ErrCheckpointTopic, topic, d.NumPartitions)
		}
		return nil
	}
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return fmt.Errorf("kafka: describe cluster: %w", err)
	}
	rf := int16(min(3, len(brokers)))
	str := func(s string) *string { return &s }
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: rf, ConfigEntries: map[string]*string{
		"cleanup.policy":            str("compact"),
		"segment.bytes":             str("16777216"),
		"min.cleanable.dirty.ratio": str("0.1"),
	}}, false)
	if errors.Is(err, sarama.ErrTopicAuthorizationFailed) || errors.Is(err, sarama.ErrClusterAuthorizationFailed) {
		return &ACLError{Operation: "Create", ResourceType: "topic", Resource: topic, Principal: cfg.Security.SASLUser, Err: err}
	}
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("kafka: create the compacted topic %q (create it yourself with cleanup.policy=compact): %w", topic, err)
	}
	return nil
}

// ReadCompacted reads topic from its start to the high watermark noted
// when the read starts and returns the latest committed value of every key.
//
// It reads read_uncommitted and decides each transactional record by its
// own producer's marker: a record counts once the COMMIT marker of its
// producer's transaction is read, never when an ABORT marker follows, and
// not while its transaction is still open at the high watermark (the value
// before it stands: what read_committed readers see until that transaction
// ends). A read_committed fetch would stop at the partition's last stable
// offset instead, where any producer's open transaction — another
// deployment sharing the topic — hides every later record until it ends:
// up to that producer's transaction timeout, or for good while a killed
// instance is not restarted. Here no other producer's transaction can hide
// or delay a key's value: the read never waits, and a key written only by
// one transactional id (a deployment's checkpoint) depends only on that
// id's transactions — which the caller fences first (InitProducerId aborts
// the open one and writes its marker before it answers).
//
// Markers stay in a compacted log while any record of their transaction
// does (the log cleaner removes a marker only after its transaction's
// records), so a record whose marker is never read is open.
//
// A read can be stale: a leader paused past its session (a long GC, a
// frozen VM) is replaced, and for a moment after it wakes it still answers
// as the leader, with the log as it was when it stopped — a checkpoint read
// there is older than what was committed since, which reads as a gap (or
// re-publishes what is in Kafka). A caller that wrote a record to the topic
// just before reading (a barrier: acks=all, so a real leader took it) passes
// it: a partition whose high watermark is not past its barrier is answered
// by such a leader, and is asked again with fresh metadata until it is.
// cfg.CheckpointReadTimeout bounds the whole read.
func ReadCompacted(ctx context.Context, cfg Config, topic string, barriers ...Barrier) (map[string][]byte, error) {
	latest, err := ReadCompactedRecords(ctx, cfg, topic, barriers...)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(latest))
	for k, v := range latest {
		out[k] = v.Value
	}
	return out, nil
}

// A CompactedRecord is a key's latest committed value in a compacted topic
// and where it is: a reader that must tell which of two keys was written
// later (the checkpoint's epochs) compares their offsets.
type CompactedRecord struct {
	Partition int32
	Offset    int64
	Value     []byte
}

// ReadCompactedRecords is ReadCompacted with each value's position.
func ReadCompactedRecords(ctx context.Context, cfg Config, topic string, barriers ...Barrier) (map[string]CompactedRecord, error) {
	sc, err := cfg.Sarama()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.CheckpointReadTimeout)
	defer cancel()
	client, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: topic %q: %w", topic, err)
	}
	latest := map[string]keyValue{}
	for _, p := range parts {
		hwm, err := highWatermarkPast(ctx, client, topic, p, barrierOf(barriers, p))
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("kafka: reading %s/%d did not finish within %s (--checkpoint-read-timeout): %w", topic, p, cfg.CheckpointReadTimeout, err)
			}
			return nil, err
		}
		r := &partitionReader{client: client, topic: topic, part: p, hwm: hwm}
		if err := r.read(ctx, latest); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("kafka: reading %s/%d did not finish within %s (--checkpoint-read-timeout): %w", topic, p, cfg.CheckpointReadTimeout, err)
			}
			return nil, err
		}
	}
	out := make(map[string]CompactedRecord, len(latest))
	for k, kv := range latest {
		if kv.value != nil {
			out[k] = CompactedRecord{Partition: kv.partition, Offset: kv.offset, Value: kv.value}
		}
	}
	return out, nil
}

// A Barrier is a record its reader wrote to the topic just before reading
// it (Partition and Offset as the producer returned them): the read must
// reach past it.
type Barrier struct {
	Partition int32
	Offset    int64
}

// barrierOf is the offset the read of partition p must reach past (-1: none).
func barrierOf(barriers []Barrier, p int32) int64 {
	at := int64(-1)
	for _, b := range barriers {
		if b.Partition == p {
			at = max(at, b.Offset)
		}
	}
	return at
}

// StaleLeaderError is a partition whose leader answered a high watermark
// not past the barrier its reader wrote: a leader that was replaced and does
// not know it yet. Asked again with fresh metadata until the read's timeout.
type StaleLeaderError struct {
	Topic         string
	Partition     int32
	HighWatermark int64
	Barrier       int64
}

func (e *StaleLeaderError) Error() string {
	return fmt.Sprintf("kafka: %s/%d: its leader answered the high watermark %d, not past the record written at offset %d just before the read: a replaced leader that does not know it yet (its log is older than what is committed)",
		e.Topic, e.Partition, e.HighWatermark, e.Barrier)
}

// highWatermarkPast is the partition's high watermark, asked again with fresh
// metadata (backing off, until ctx ends) while it is not past barrier.
func highWatermarkPast(ctx context.Context, client sarama.Client, topic string, p int32, barrier int64) (int64, error) {
	for attempt := 1; ; attempt++ {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, fmt.Errorf("kafka: %s/%d high watermark: %w", topic, p, err)
		}
		if hwm > barrier {
			return hwm, nil
		}
		stale := &StaleLeaderError{Topic: topic, Partition: p, HighWatermark: hwm, Barrier: barrier}
		if !backoff.Sleep(ctx, backoff.Exponential(10*time.Millisecond, time.Second, attempt)) {
			return 0, fmt.Errorf("%w: %w", stale, ctx.Err())
		}
		if err := client.RefreshMetadata(topic); err != nil {
			return 0, fmt.Errorf("%w: refresh metadata: %w", stale, err)
		}
	}
}

// keyValue is a key's latest committed value (nil: a tombstone) and its offset.
type keyValue struct {
	partition int32
	offset    int64
	value     []byte
}

// partitionReader reads one partition of a compacted topic up to hwm.
type partitionReader struct {
	client sarama.Client
	topic  string
	part   int32
	hwm    int64
}

// pendingRecord is a record of a transaction whose marker is not read yet.
type pendingRecord struct {
	key    string
	offset int64
	value  []byte
}

// read reads the partition from its start to hwm into latest.
func (pr *partitionReader) read(ctx context.Context, latest map[string]keyValue) error {
	off, err := pr.client.GetOffset(pr.topic, pr.part, sarama.OffsetOldest)
	if err != nil {
		return fmt.Errorf("kafka: %s/%d start offset: %w", pr.topic, pr.part, err)
	}
	// The records of each producer's transaction not decided yet.
	pending := map[int64][]pendingRecord{}
	empty := 0 // answers in a row with no record below the high watermark
	for off < pr.hwm {
		if err := ctx.Err(); err != nil {
			return err
		}
		block, err := pr.fetch(off)
		if err != nil {
			return err
		}
		progressed := false
		for _, rs := range block.RecordsSet {
			rb := rs.RecordBatch
			if rb == nil || rb.FirstOffset >= pr.hwm {
				continue
			}
			last := rb.FirstOffset + int64(rb.LastOffsetDelta)
			if last < off {
				continue
			}
			pr.take(rb, off, pending, latest)
			off = last + 1
			progressed, empty = true, 0
		}
		if !progressed {
			if len(block.RecordsSet) == 0 && off < block.HighWaterMarkOffset {
				// Nothing came although records are there. The cleaner
				// swapping the segment that holds off answers so for a
				// moment (seen on a real broker under load); a batch larger
				// than the fetch answers so for ever: ask again a few
				// times, then give up loudly rather than loop.
				if empty++; empty >= maxEmptyFetches {
					return fmt.Errorf("kafka: fetch %s/%d at offset %d returned nothing below the high watermark %d, %d times", pr.topic, pr.part, off, block.HighWaterMarkOffset, empty)
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			if off < pr.hwm {
				// A new leader may briefly answer with a lower high
				// watermark than the one noted: ask again.
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return nil
}

// maxEmptyFetches is how many answers in a row with no record below the
// high watermark the reader takes (10 ms apart) before it gives up.
const maxEmptyFetches = 50

// fetch asks the partition's leader for its records from off,
// read_uncommitted.
func (pr *partitionReader) fetch(off int64) (*sarama.FetchResponseBlock, error) {
	topic, part := pr.topic, pr.part
	b, err := pr.client.Leader(topic, part)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s/%d leader: %w", topic, part, err)
	}
	req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 16 << 20,
		Isolation: sarama.ReadUncommitted}
	req.AddBlock(topic, part, off, 8<<20, -1)
	resp, err := b.Fetch(req)
	if err != nil {
		return nil, fmt.Errorf("kafka: fetch %s/%d: %w", topic, part, err)
	}
	block := resp.GetBlock(topic, part)
	if block == nil {
		return nil, fmt.Errorf("kafka: fetch %s/%d: no answer for the partition", topic, part)
	}
	if !errors.Is(block.Err, sarama.ErrNoError) {
		return nil, fmt.Errorf("kafka: fetch %s/%d: %w", topic, part, block.Err)
	}
	return block, nil
}

// take reads one record batch from offset off (below hwm): a plain record
// counts at once, a transactional one waits in pending for its producer's
// marker, and a marker decides its producer's pending records.
func (pr *partitionReader) take(rb *sarama.RecordBatch, off int64, pending map[int64][]pendingRecord, latest map[string]keyValue) {
	if rb.Control {
		// The end of the producer's transaction: its records count if it
		// committed.
		if len(rb.Records) > 0 && controlType(rb.Records[0].Key) == sarama.ControlRecordCommit {
			for _, r := range pending[rb.ProducerID] {
				putLatest(latest, r.key, pr.part, r.offset, r.value)
			}
		}
		delete(pending, rb.ProducerID)
		return
	}
	for _, r := range rb.Records {
		o := rb.FirstOffset + r.OffsetDelta
		if o < off || o >= pr.hwm {
			continue
		}
		if rb.IsTransactional {
			pending[rb.ProducerID] = append(pending[rb.ProducerID], pendingRecord{string(r.Key), o, r.Value})
		} else {
			putLatest(latest, string(r.Key), pr.part, o, r.Value)
		}
	}
}

// putLatest makes value key's latest unless a later offset of it was read.
func putLatest(latest map[string]keyValue, key string, p int32, o int64, value []byte) {
	if cur, ok := latest[key]; !ok || o > cur.offset {
		latest[key] = keyValue{partition: p, offset: o, value: value}
	}
}

// controlType is the type of a control record from its key (version,
// type: two big-endian int16).
func controlType(key []byte) sarama.ControlRecordType {
	if len(key) < 4 {
		return sarama.ControlRecordUnknown
	}
	switch binary.BigEndian.Uint16(key[2:4]) {
	case 0:
		return sarama.ControlRecordAbort
	case 1:
		return sarama.ControlRecordCommit
	}
	return sarama.ControlRecordUnknown
}
