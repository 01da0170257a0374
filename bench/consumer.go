package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/outbox"
)

// receipt is one record as the consumer got it, stamped on arrival.
type receipt struct {
	id   int64
	key  int32
	recv stamp
}

// consumer reads every partition of a topic from the oldest offset and
// stamps each record when the client hands it over.
type consumer struct {
	c   sarama.Consumer
	pcs []sarama.PartitionConsumer
	wg  sync.WaitGroup
	n   atomic.Int64
	// from and nFrom: records with an outbox id ≥ from, counted (see
	// countFrom).
	from, nFrom atomic.Int64
	parts       [][]receipt // per partition, in offset order
}

func startConsumer(s stack, topic string, clk clock) (*consumer, error) {
	c, err := sarama.NewConsumer(s.Brokers, kafkaConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	parts, err := c.Partitions(topic)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	k := &consumer{c: c, parts: make([][]receipt, len(parts))}
	for i, p := range parts {
		// A topic just created may not have its leader settled yet.
		var pc sarama.PartitionConsumer
		for deadline := time.Now().Add(30 * time.Second); ; {
			if pc, err = c.ConsumePartition(topic, p, sarama.OffsetOldest); err == nil {
				break
			}
			if time.Now().After(deadline) {
				k.close()
				return nil, fmt.Errorf("consume %s/%d: %w", topic, p, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		k.pcs = append(k.pcs, pc)
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			for m := range pc.Messages() {
				now := clk.now()
				r := receipt{id: -1, recv: now}
				for _, h := range m.Headers {
					if string(h.Key) == outbox.HeaderOutboxID {
						r.id, _ = strconv.ParseInt(string(h.Value), 10, 64)
					}
				}
				if key, ok := strings.CutPrefix(string(m.Key), "agg-"); ok {
					v, _ := strconv.Atoi(key)
					r.key = int32(v)
				}
				k.parts[i] = append(k.parts[i], r)
				k.n.Add(1)
				if r.id >= k.from.Load() {
					k.nFrom.Add(1)
				}
			}
		}()
	}
	return k, nil
}

func (k *consumer) count() int { return int(k.n.Load()) }

// countFrom counts, from now on, only the records with an outbox id ≥ id:
// rows written before a publisher's stream started may never arrive (they
// are not in its slot), and must not hold up or inflate the count of what
// is measured.
func (k *consumer) countFrom(id int64) {
	k.nFrom.Store(0)
	k.from.Store(id)
}

// waitForFrom waits until n records counted since countFrom arrived.
func (k *consumer) waitForFrom(n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for int(k.nFrom.Load()) < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// close stops consuming and returns what arrived, per partition.
func (k *consumer) close() [][]receipt {
	for _, pc := range k.pcs {
		pc.AsyncClose()
	}
	k.wg.Wait()
	k.c.Close()
	return k.parts
}

// highWatermarks sums the next offsets of every partition: the number of
// records Kafka holds (the topic is fresh and nothing is compacted).
func highWatermarks(client sarama.Client, topic string) (int64, error) {
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, p := range parts {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		sum += off
	}
	return sum, nil
}
