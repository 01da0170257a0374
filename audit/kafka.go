package audit

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// partitionRead is one partition to read: from start to hwm.
type partitionRead struct {
	topic     uint16
	partition int32
	start     int64
	hwm       int64
}

// readKafka notes every partition's high watermark first (the audit's
// moment), then reads each partition up to it into the index.
func (a *auditor) readKafka(ctx context.Context, kcfg kafka.Config) error {
	sc, err := kcfg.Sarama()
	if err != nil {
		return err
	}
	client, err := sarama.NewClient(kcfg.Brokers, sc)
	if err != nil {
		return fmt.Errorf("audit: kafka: %w", err)
	}
	defer client.Close()
	var reads []partitionRead
	for ti, topic := range a.topics {
		parts, err := client.Partitions(topic)
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			continue // no records: every row of it is missing
		}
		if err != nil {
			return fmt.Errorf("audit: kafka: topic %q: %w", topic, err)
		}
		st := a.stats[ti]
		st.Partitions = len(parts)
		st.HighWatermarks = make([]int64, len(parts))
		for i, p := range parts {
			hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return fmt.Errorf("audit: kafka: %s/%d high watermark: %w", topic, p, err)
			}
			st.HighWatermarks[i] = hwm
			reads = append(reads, partitionRead{topic: uint16(ti), partition: p, hwm: hwm})
		}
	}
	for i := range reads {
		r := &reads[i]
		if err := a.startOffset(client, r); err != nil {
			return err
		}
		if r.start >= r.hwm {
			continue
		}
		if err := a.waitStable(ctx, client, r); err != nil {
			return err
		}
		if err := a.readPartition(ctx, client, r); err != nil {
			return err
		}
	}
	return nil
}

// startOffset is where r's read starts: the partition's start, or the first
// offset at or after FromOffsetTime.
func (a *auditor) startOffset(client sarama.Client, r *partitionRead) error {
	topic := a.topics[r.topic]
	at := sarama.OffsetOldest
	if !a.cfg.FromOffsetTime.IsZero() {
		at = a.cfg.FromOffsetTime.UnixMilli()
	}
	off, err := client.GetOffset(topic, r.partition, at)
	if err != nil {
		return fmt.Errorf("audit: kafka: %s/%d start offset: %w", topic, r.partition, err)
	}
	if off < 0 { // no record that late
		off = r.hwm
	}
	r.start = off
	return nil
}

// waitStable waits until the partition's last stable offset reaches the
// high watermark noted: until then a read_committed fetch stops below it,
// at the first record of a transaction still open (any producer's), and
// the records after it could not be judged.
func (a *auditor) waitStable(ctx context.Context, client sarama.Client, r *partitionRead) error {
	topic := a.topics[r.topic]
	ctx, cancel := context.WithTimeout(ctx, a.cfg.StableTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		lso, err := lastStableOffset(client, topic, r.partition)
		if err == nil && lso >= r.hwm {
			return nil
		}
		if !backoff.Sleep(ctx, backoff.Exponential(10*time.Millisecond, time.Second, attempt)) {
			if err != nil {
				return fmt.Errorf("audit: kafka: %s/%d last stable offset: %w", topic, r.partition, err)
			}
			return fmt.Errorf("audit: kafka: %s/%d: the last stable offset stayed at %d, below the high watermark %d noted at the start, for %s (--stable-timeout): a transaction is open there (a producer that died inside one holds it until its transaction timeout)",
				topic, r.partition, lso, r.hwm, a.cfg.StableTimeout)
		}
		if err != nil {
			_ = client.RefreshMetadata(topic)
		}
	}
}

// lastStableOffset asks the partition's leader for its last stable offset
// (ListOffsets latest, read_committed).
func lastStableOffset(client sarama.Client, topic string, p int32) (int64, error) {
	b, err := client.Leader(topic, p)
	if err != nil {
		return 0, err
	}
	req := sarama.NewOffsetRequest(client.Config().Version)
	req.IsolationLevel = sarama.ReadCommitted
	req.AddBlock(topic, p, sarama.OffsetNewest, 1)
	resp, err := b.GetAvailableOffsets(req)
	if err != nil {
		return 0, err
	}
	block := resp.GetBlock(topic, p)
	if block == nil {
		return 0, errors.New("no answer for the partition")
	}
	if !errors.Is(block.Err, sarama.ErrNoError) {
		return 0, block.Err
	}
	if len(block.Offsets) > 0 && req.Version == 0 {
		return block.Offsets[0], nil
	}
	return block.Offset, nil
}

// readPartition reads r read_committed from its start to its high watermark
// and indexes every committed record. Records of aborted transactions are
// dropped the way the Java consumer drops them: the fetch names each aborted
// transaction's producer and first offset, and that producer's
// transactional batches are skipped from there until its abort marker.
func (a *auditor) readPartition(ctx context.Context, client sarama.Client, r *partitionRead) error {
	topic := a.topics[r.topic]
	st := a.stats[r.topic]
	idh := idHeader(&a.cfg.Mapping)
	var h maphash.Hash
	h.SetSeed(a.seed)
	// The order check: per key of this partition, the highest id first
	// delivered so far.
	lastID := map[uint64]int64{}
	rec := record{topic: r.topic, partition: r.partition}
	off := r.start
	for attempt := 0; off < r.hwm; {
		if err := ctx.Err(); err != nil {
			return err
		}
		block, err := fetch(client, topic, r.partition, off)
		if err != nil {
			// A leader change: fresh metadata, and again, for a while.
			attempt++
			if attempt > 10 || !backoff.Sleep(ctx, backoff.Exponential(50*time.Millisecond, time.Second, attempt)) {
				return err
			}
			_ = client.RefreshMetadata(topic)
			continue
		}
		aborted := block.AbortedTransactions
		abortedBy := map[int64]bool{}
		progressed := false
		for _, rs := range block.RecordsSet {
			rb := rs.RecordBatch
			if rb == nil {
				return fmt.Errorf("audit: kafka: %s/%d at offset %d: a message set of the old format (before Kafka 0.11): not supported", topic, r.partition, off)
			}
			last := rb.FirstOffset + int64(rb.LastOffsetDelta)
			if last < off {
				continue
			}
			if rb.FirstOffset >= r.hwm {
				off = r.hwm
				break
			}
			if rb.PartialTrailingRecord {
				// Cut off by the fetch's size: the next fetch starts
				// with it (a batch that comes first comes whole).
				break
			}
			for len(aborted) > 0 && minFirstOffset(aborted) <= last {
				i := indexMinFirstOffset(aborted)
				abortedBy[aborted[i].ProducerID] = true
				aborted = slices.Delete(aborted, i, i+1)
			}
			off, progressed = last+1, true
			if rb.Control {
				if len(rb.Records) > 0 && isAbortMarker(rb.Records[0].Key) {
					delete(abortedBy, rb.ProducerID)
				}
				continue
			}
			if rb.IsTransactional && abortedBy[rb.ProducerID] {
				continue
			}
			for _, kr := range rb.Records {
				o := rb.FirstOffset + kr.OffsetDelta
				if o < r.start || o >= r.hwm {
					continue
				}
				a.take(&h, &rec, rb, kr, o, idh, st, lastID)
			}
		}
		if progressed {
			attempt = 0
			continue
		}
		if len(block.RecordsSet) == 0 && off < block.LastStableOffset {
			return fmt.Errorf("audit: kafka: fetch %s/%d at offset %d returned nothing below the last stable offset %d", topic, r.partition, off, block.LastStableOffset)
		}
		// The leader answered below the offset asked (a new leader catching
		// up): ask again, for a while.
		attempt++
		if attempt > 50 || !backoff.Sleep(ctx, backoff.Exponential(10*time.Millisecond, time.Second, attempt)) {
			return fmt.Errorf("audit: kafka: %s/%d: no record past offset %d although the high watermark noted was %d", topic, r.partition, off, r.hwm)
		}
	}
	return nil
}

// take indexes one committed record at offset o.
func (a *auditor) take(h *maphash.Hash, rec *record, rb *sarama.RecordBatch, kr *sarama.Record, o int64, idh string, st *TopicReport, lastID map[uint64]int64) {
	id, ok := int64(0), false
	var origin []byte
	for _, hd := range kr.Headers {
		switch string(hd.Key) {
		case idh:
			id, ok = parseID(hd.Value)
		case outbox.HeaderOrigin:
			origin = hd.Value
		}
	}
	if !ok {
		st.Foreign++
		return
	}
	rec.id, rec.offset = id, o
	if rb.LogAppendTime {
		rec.timestamp = rb.MaxTimestamp
	} else {
		rec.timestamp = rb.FirstTimestamp.Add(kr.TimestampDelta)
	}
	if a.cfg.CheckContent {
		rec.hash = hashRecord(h, kr.Key, kr.Value, len(kr.Headers), func(i int) ([]byte, []byte) {
			return kr.Headers[i].Key, kr.Headers[i].Value
		})
	}
	h.Reset()
	_, _ = h.Write(origin)
	rec.origin = uint32(h.Sum64())
	h.Reset()
	_, _ = h.Write(kr.Key)
	rec.keyHash = h.Sum64()
	if !a.add(rec) {
		return
	}
	if prev, seen := lastID[rec.keyHash]; seen && prev > id {
		st.Reorders.add(id, a.cfg.Examples)
		return
	}
	lastID[rec.keyHash] = id
}

// fetch asks the partition's leader for its committed records from off.
func fetch(client sarama.Client, topic string, p int32, off int64) (*sarama.FetchResponseBlock, error) {
	b, err := client.Leader(topic, p)
	if err != nil {
		return nil, fmt.Errorf("audit: kafka: %s/%d leader: %w", topic, p, err)
	}
	req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 16 << 20,
		Isolation: sarama.ReadCommitted}
	req.AddBlock(topic, p, off, 8<<20, -1)
	resp, err := b.Fetch(req)
	if err != nil {
		return nil, fmt.Errorf("audit: kafka: fetch %s/%d: %w", topic, p, err)
	}
	block := resp.GetBlock(topic, p)
	if block == nil {
		return nil, fmt.Errorf("audit: kafka: fetch %s/%d: no answer for the partition", topic, p)
	}
	if !errors.Is(block.Err, sarama.ErrNoError) {
		return nil, fmt.Errorf("audit: kafka: fetch %s/%d: %w", topic, p, block.Err)
	}
	return block, nil
}

func indexMinFirstOffset(at []*sarama.AbortedTransaction) int {
	i := 0
	for j := range at {
		if at[j].FirstOffset < at[i].FirstOffset {
			i = j
		}
	}
	return i
}

func minFirstOffset(at []*sarama.AbortedTransaction) int64 {
	return at[indexMinFirstOffset(at)].FirstOffset
}

// isAbortMarker reports whether a control record's key (version, type: two
// big-endian int16) is an abort marker.
func isAbortMarker(key []byte) bool {
	return len(key) >= 4 && key[2] == 0 && key[3] == 0
}
