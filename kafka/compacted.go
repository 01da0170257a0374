package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
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
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("kafka: create the compacted topic %q (create it yourself with cleanup.policy=compact): %w", topic, err)
	}
	return nil
}

// ReadCompacted reads topic from its start to its last stable offset as a
// read_committed consumer would (records of aborted transactions skipped)
// and returns the last value of every key.
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
	for _, p := range parts {
		if err := readPartition(ctx, client, topic, p, latest); err != nil {
			return nil, err
		}
	}
	return latest, nil
}

func readPartition(ctx context.Context, client sarama.Client, topic string, part int32, latest map[string][]byte) error {
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
		if off >= lso {
			return nil
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
