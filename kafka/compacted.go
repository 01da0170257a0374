package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// EnsureCompactedTopic creates topic as a compacted topic with one partition
// when it does not exist. Its segments are small so that compaction keeps it
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
	if _, ok := topics[topic]; ok {
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

// ReadCompacted reads topic from its start to its high watermark as a
// read_committed consumer would (records of aborted transactions skipped)
// and returns the last value of every key.
//
// A read_committed fetch stops at the last stable offset: an open
// transaction of any producer — another deployment sharing the topic —
// hides every later record of its partition until it ends. Stopping there
// could return an older checkpoint than the latest one committed, so the
// read goes on to the high watermark noted when it started, waiting for
// open transactions to end (they do within their producer's transaction
// timeout, at most the brokers' transaction.max.timeout.ms) until
// cfg.CheckpointReadTimeout; then it fails with an *OpenTxnError naming
// the transactions in the way.
func ReadCompacted(ctx context.Context, cfg Config, topic string) (map[string][]byte, error) {
	sc, err := cfg.Sarama()
	if err != nil {
		return nil, err
	}
	client, err := sarama.NewClient(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: topic %q: %w", topic, err)
	}
	latest := map[string][]byte{}
	deadline := time.Now().Add(cfg.CheckpointReadTimeout)
	for _, p := range parts {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("kafka: %s/%d high watermark: %w", topic, p, err)
		}
		r := &partitionReader{client: client, topic: topic, part: p, hwm: hwm, deadline: deadline, started: time.Now()}
		if err := r.read(ctx, latest); err != nil {
			return nil, err
		}
	}
	return latest, nil
}

// OpenTxnError means a read_committed read could not reach the high
// watermark: a transaction stayed open past the read's deadline.
type OpenTxnError struct {
	Topic     string
	Partition int32
	Stable    int64 // last stable offset reached
	HighWater int64
	// Holders are the open transactions on the partition, as far as the
	// brokers tell (DescribeProducers, ListTransactions): "transactional
	// id (producer id P since offset O)".
	Holders []string
	Waited  time.Duration
}

func (e *OpenTxnError) Error() string {
	holders := "unknown (the brokers did not say)"
	if len(e.Holders) > 0 {
		holders = strings.Join(e.Holders, ", ")
	}
	return fmt.Sprintf("kafka: %s/%d: an open transaction hides offsets %d to %d from read_committed readers after waiting %s; held by %s: it ends when its producer commits or its transaction timeout aborts it (kafka-transactions.sh --bootstrap-server <broker> abort can end it sooner); use a checkpoint topic per deployment (--checkpoint-topic) so others' transactions cannot hold yours",
		e.Topic, e.Partition, e.Stable, e.HighWater, e.Waited.Round(100*time.Millisecond), holders)
}

// partitionReader reads one partition of a compacted topic up to hwm.
type partitionReader struct {
	client   sarama.Client
	topic    string
	part     int32
	hwm      int64
	deadline time.Time
	started  time.Time
}

func (pr *partitionReader) read(ctx context.Context, latest map[string][]byte) error {
	client, topic, part := pr.client, pr.topic, pr.part
	off, err := client.GetOffset(topic, part, sarama.OffsetOldest)
	if err != nil {
		return fmt.Errorf("kafka: %s/%d start offset: %w", topic, part, err)
	}
	// Producers whose aborted transaction the fetch position is inside, and
	// the aborted transactions not reached yet, by first offset.
	abortedPIDs := map[int64]bool{}
	var abortedTxns []*sarama.AbortedTransaction
	seen := map[sarama.AbortedTransaction]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := client.Leader(topic, part)
		if err != nil {
			return fmt.Errorf("kafka: %s/%d leader: %w", topic, part, err)
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 16 << 20,
			Isolation: sarama.ReadCommitted}
		req.AddBlock(topic, part, off, 8<<20, -1)
		resp, err := b.Fetch(req)
		if err != nil {
			return fmt.Errorf("kafka: fetch %s/%d: %w", topic, part, err)
		}
		block := resp.GetBlock(topic, part)
		if block == nil {
			return fmt.Errorf("kafka: fetch %s/%d: no answer for the partition", topic, part)
		}
		if !errors.Is(block.Err, sarama.ErrNoError) {
			return fmt.Errorf("kafka: fetch %s/%d: %w", topic, part, block.Err)
		}
		lso := block.LastStableOffset
		if off >= pr.hwm {
			return nil
		}
		if off >= lso {
			// Everything stable is read; an open transaction holds the rest.
			if err := pr.waitOpenTxn(off); err != nil {
				return err
			}
			continue
		}
		for _, at := range block.AbortedTransactions {
			if !seen[*at] && at.FirstOffset >= off {
				seen[*at] = true
				abortedTxns = append(abortedTxns, at)
			}
		}
		slices.SortFunc(abortedTxns, func(a, b *sarama.AbortedTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
		progressed := false
		for _, rs := range block.RecordsSet {
			rb := rs.RecordBatch
			if rb == nil {
				continue
			}
			last := rb.FirstOffset + int64(rb.LastOffsetDelta)
			if last < off {
				continue
			}
			for len(abortedTxns) > 0 && abortedTxns[0].FirstOffset <= rb.FirstOffset {
				abortedPIDs[abortedTxns[0].ProducerID] = true
				abortedTxns = abortedTxns[1:]
			}
			switch {
			case rb.Control:
				delete(abortedPIDs, rb.ProducerID) // the end of its transaction
			case rb.IsTransactional && abortedPIDs[rb.ProducerID]:
				// aborted: never visible to read_committed readers
			default:
				for _, r := range rb.Records {
					o := rb.FirstOffset + r.OffsetDelta
					if o < off || o >= lso {
						continue
					}
					if r.Value == nil {
						delete(latest, string(r.Key)) // a tombstone
					} else {
						latest[string(r.Key)] = r.Value
					}
				}
			}
			off = last + 1
			progressed = true
		}
		if !progressed {
			if len(block.RecordsSet) == 0 && off < lso {
				// Nothing came although records are there (a batch larger
				// than the fetch): give up loudly rather than loop.
				return fmt.Errorf("kafka: fetch %s/%d at offset %d returned nothing below the last stable offset %d", topic, part, off, lso)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitOpenTxn paces the read while an open transaction holds the partition
// at stable offset off, and fails once the deadline passed.
func (pr *partitionReader) waitOpenTxn(off int64) error {
	now := time.Now()
	if now.After(pr.deadline) {
		return &OpenTxnError{Topic: pr.topic, Partition: pr.part, Stable: off, HighWater: pr.hwm,
			Holders: openTxnHolders(pr.client, pr.topic, pr.part), Waited: now.Sub(pr.started)}
	}
	time.Sleep(50 * time.Millisecond) // the fetch itself waited up to 100 ms
	return nil
}

// openTxnHolders names the open transactions on a partition, as far as the
// brokers tell: DescribeProducers (Kafka ≥ 3.0) gives the producer ids
// with a transaction open, ListTransactions their transactional ids.
func openTxnHolders(client sarama.Client, topic string, part int32) []string {
	leader, err := client.Leader(topic, part)
	if err != nil {
		return nil
	}
	resp, err := leader.DescribeProducers(&sarama.DescribeProducersRequest{
		Topics: []sarama.DescribeProducersRequestTopic{{Name: topic, PartitionIndexes: []int32{part}}}})
	if err != nil {
		return nil
	}
	open := map[int64]int64{} // producer id → first offset of its open transaction
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			for _, ps := range p.ActiveProducers {
				if ps.CurrentTxnStartOffset >= 0 {
					open[ps.ProducerID] = ps.CurrentTxnStartOffset
				}
			}
		}
	}
	if len(open) == 0 {
		return nil
	}
	ids := make([]int64, 0, len(open))
	for id := range open {
		ids = append(ids, id)
	}
	names := map[int64]string{}
	// DurationFilter -1: none (0 is refused by version 0).
	req := &sarama.ListTransactionsRequest{ProducerIDFilters: ids, DurationFilter: -1}
	for _, b := range client.Brokers() { // each broker lists what it coordinates
		lt, err := b.ListTransactions(req)
		if err != nil {
			_ = b.Open(client.Config())
			if lt, err = b.ListTransactions(req); err != nil {
				continue
			}
		}
		for _, ts := range lt.TransactionStates {
			names[ts.ProducerID] = ts.TransactionalID
		}
	}
	slices.Sort(ids)
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		name := names[id]
		if name == "" {
			name = "an unnamed transactional id"
		}
		out = append(out, fmt.Sprintf("%q (producer id %d, open since offset %d)", name, id, open[id]))
	}
	return out
}
