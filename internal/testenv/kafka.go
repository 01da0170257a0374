package testenv

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// KafkaEnv is the shared Kafka cluster.
type KafkaEnv struct {
	Brokers []string
}

// Kafka returns the shared Kafka cluster, after checking that it answers.
func Kafka(t testing.TB) *KafkaEnv {
	t.Helper()
	needServers(t)
	brokers := KafkaBrokers()
	if len(brokers) == 0 {
		unavailable(t, hintKafka, "Kafka is not configured: %s is unset and no %s was found", kafkaBrokersVar, envFileName)
	}
	k := &KafkaEnv{Brokers: brokers}
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		unavailable(t, hintKafka, "Kafka (%s=%s) is not reachable: %v", kafkaBrokersVar, strings.Join(brokers, ","), err)
	}
	_ = admin.Close()
	return k
}

// KafkaBrokers are the shared Kafka's brokers (OUTBOXD_KAFKA_BROKERS, else
// .devstack.env's), none when neither sets them.
func KafkaBrokers() []string {
	var brokers []string
	for _, b := range strings.Split(setting(kafkaBrokersVar), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return brokers
}

// Config returns a base sarama config for the test cluster: Version set for
// Kafka 4 (which rejects the old protocol versions sarama defaults to),
// ClientID "outboxd-test", producer successes returned (as a SyncProducer
// needs) and consumers starting from the oldest offset.
func (k *KafkaEnv) Config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.ClientID = "outboxd-test"
	cfg.Net.DialTimeout = 5 * time.Second
	cfg.Producer.Return.Successes = true
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	return cfg
}

// Topic creates a uniquely named topic with the given number of partitions
// (replication factor 1), waits until every partition has a leader, and
// deletes the topic at cleanup.
func (k *KafkaEnv) Topic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	name, err := k.CreateTopic(prefix, partitions)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := k.DeleteTopic(name); err != nil {
			t.Logf("testenv: %v", err) // harmless: topic names are unique
		}
	})
	return name
}

// CreateTopic is Topic for a program that is not a test (bench/): the
// caller deletes the topic (DeleteTopic). A topic whose partitions get no
// leader is deleted again and reported.
func (k *KafkaEnv) CreateTopic(prefix string, partitions int32) (string, error) {
	if partitions < 1 {
		partitions = 1
	}
	name := UniqueName(prefix)
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		return "", fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	detail := &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}
	if err := admin.CreateTopic(name, detail, false); err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	if err := waitForLeaders(admin, name, int(partitions), 30*time.Second); err != nil {
		_ = admin.DeleteTopic(name)
		return "", err
	}
	return name, nil
}

// waitForLeaders polls the topic's metadata until all partitions have a leader.
func waitForLeaders(admin sarama.ClusterAdmin, topic string, partitions int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		md, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && errors.Is(md[0].Err, sarama.ErrNoError) && len(md[0].Partitions) == partitions {
			ready := true
			for _, p := range md[0].Partitions {
				ready = ready && p.Leader >= 0 && errors.Is(p.Err, sarama.ErrNoError)
			}
			if ready {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions without a leader after %s (last error: %v)", topic, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DeleteTopic deletes a topic.
func (k *KafkaEnv) DeleteTopic(name string) error {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", name, err)
	}
	defer admin.Close()
	if err := admin.DeleteTopic(name); err != nil {
		return fmt.Errorf("delete topic %s: %w", name, err)
	}
	return nil
}

// ReadAll consumes every partition of topic from the oldest offset until it
// has want messages or timeout passes, and returns what it got (in arrival
// order; ordered within a partition). It fails the test only if it cannot
// consume at all: compare len(result) with want yourself.
func (k *KafkaEnv) ReadAll(t testing.TB, topic string, want int, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	consumer, err := sarama.NewConsumer(k.Brokers, k.Config())
	if err != nil {
		t.Fatalf("testenv: kafka consumer: %v", err)
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(topic)
	if err != nil {
		t.Fatalf("testenv: partitions of %s: %v", topic, err)
	}

	msgs := make(chan *sarama.ConsumerMessage)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range partitions {
		pc, err := consumer.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			close(done)
			wg.Wait()
			t.Fatalf("testenv: consume %s/%d: %v", topic, p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			forward(consumer, pc, topic, p, msgs, done)
		}()
	}
	defer wg.Wait()
	defer close(done)

	var got []*sarama.ConsumerMessage
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for len(got) < want {
		select {
		case m := <-msgs:
			got = append(got, m)
		case <-timer.C:
			k.logShortRead(t, topic, partitions, got, want)
			return got
		}
	}
	return got
}

// logShortRead says, for a read that ended at its timeout, how many
// records each partition holds beside how many were read from it: a short
// read is either a producer that did not deliver (the log end is short
// too) or a reader that did not consume (the log end is not), and the test
// that fails should say which.
func (k *KafkaEnv) logShortRead(t testing.TB, topic string, partitions []int32, got []*sarama.ConsumerMessage, want int) {
	t.Helper()
	read := map[int32]int{}
	for _, m := range got {
		read[m.Partition]++
	}
	client, err := sarama.NewClient(k.Brokers, k.Config())
	if err != nil {
		t.Logf("testenv: read %d of %d records of %s; log ends unknown: %v", len(got), want, topic, err)
		return
	}
	defer client.Close()
	var parts []string
	held := int64(0)
	for _, p := range partitions {
		oldest, err1 := client.GetOffset(topic, p, sarama.OffsetOldest)
		newest, err2 := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err := errors.Join(err1, err2); err != nil {
			parts = append(parts, fmt.Sprintf("%d: read %d, log end unknown (%v)", p, read[p], err))
			continue
		}
		held += newest - oldest
		parts = append(parts, fmt.Sprintf("%d: read %d of offsets %d..%d", p, read[p], oldest, newest))
	}
	t.Logf("testenv: read %d of %d records of %s within the timeout; the topic holds %d (a read_uncommitted count, aborted and control records included); by partition: %s",
		len(got), want, topic, held, strings.Join(parts, "; "))
}

// partitionOpener is the part of sarama.Consumer forward uses.
type partitionOpener interface {
	ConsumePartition(topic string, partition int32, offset int64) (sarama.PartitionConsumer, error)
}

// forward sends what pc reads to msgs until done. sarama shuts a partition
// consumer down on some answers (an offset out of range, retries
// exhausted) by closing its Messages channel: the partition is consumed
// again from the next offset (a CI run read a nil message from the closed
// channel and panicked).
func forward(consumer partitionOpener, pc sarama.PartitionConsumer, topic string, partition int32, msgs chan<- *sarama.ConsumerMessage, done <-chan struct{}) {
	next := sarama.OffsetOldest
	for {
		if pc != nil {
			if !forwardUntilClosed(pc, msgs, done, &next) {
				pc.Close()
				return
			}
			pc.Close()
		}
		select {
		case <-done:
			return
		case <-time.After(100 * time.Millisecond): // back off before consuming again
		}
		pc, _ = consumer.ConsumePartition(topic, partition, next) // nil on failure: tried again
	}
}

// forwardUntilClosed forwards pc's messages, keeping next past the last
// one; it returns false when done, true when pc stopped by itself.
func forwardUntilClosed(pc sarama.PartitionConsumer, msgs chan<- *sarama.ConsumerMessage, done <-chan struct{}, next *int64) bool {
	for {
		select {
		case m, ok := <-pc.Messages():
			if !ok {
				return true
			}
			select {
			case msgs <- m:
				*next = m.Offset + 1
			case <-done:
				return false
			}
		case <-done:
			return false
		}
	}
}
