package kafka

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// startFakeKafkaBrokers is startFakeKafka with n brokers.
func startFakeKafkaBrokers(t *testing.T, n int, partitions int32, topics ...string) *fakeKafka {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(n), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f := &fakeKafka{c: c, log: &produceLog{}}
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.log.observe(kreq)
		return nil, nil, false // observe only; kept
	})
	return f
}

// holdResponses makes p hold every produce response for a partition of
// topic until release is closed (the broker answered; the producer has not
// read it yet); held is closed once the first is held. The connection stays
// free for other requests, such as metadata.
func holdResponses(p *Producer, topic string, part int32) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.testRespond = func(pr produceResponse) {
		for _, ps := range pr.parts {
			if ps.topic.name == topic && ps.partition == part {
				once.Do(func() { close(held) })
				<-release
			}
		}
	}
	return held, release
}

// The panic: a metadata refresh says the topic is unknown (it was
// deleted) while one of its partitions has a batch in flight on another
// broker. Stopping the topic must not drop that batch: its response comes
// back later, and its records come back exactly once — acknowledged when
// the broker appended them, refused (poison) when it did not.
func TestKafkaProducerTopicDeletedWithABatchInFlight(t *testing.T) {
	for _, cont := range []bool{false, true} {
		for _, refused := range []bool{false, true} {
			name := map[bool]string{false: "halt", true: "dead-letter"}[cont] + map[bool]string{false: "/acked", true: "/refused"}[refused]
			t.Run(name, func(t *testing.T) { topicDeletedInFlight(t, cont, refused) })
		}
	}
}

func topicDeletedInFlight(t *testing.T, cont, refused bool) {
	f := startFakeKafkaBrokers(t, 2, 2, "t")
	if err := f.c.MoveTopicPartition("t", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.c.MoveTopicPartition("t", 1, 1); err != nil {
		t.Fatal(err)
	}
	if refused {
		f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			return failProduce(kreq, 3), nil, true // UNKNOWN_TOPIC_OR_PARTITION
		})
	}
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.ContinueAfterPoison = cont
	cfg.UnknownTopicTimeout = 100 * time.Millisecond
	p := newTestProducer(t, cfg)
	held, release := holdResponses(p, "t", 0)
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	keyP0, keyP1 := keyFor(t, 0, 2), keyFor(t, 1, 2)
	sendAll(t, p, rec(1, "t", keyP0))
	<-held
	if err := f.c.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	// Partition 1 has no leader known yet: its record makes the producer
	// look the topic up, and the answer is "unknown".
	sendAll(t, p, rec(2, "t", keyP1))
	r2 := results(t, p, 1)[0]
	if r2.OutboxID != 2 || !errors.Is(r2.Err, ErrPoison) || !errors.Is(r2.Err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("record %d: %v, want record 2 poison (unknown topic)", r2.OutboxID, r2.Err)
	}
	releaseOnce.Do(func() { close(release) })
	r1 := results(t, p, 1)[0]
	switch {
	case r1.OutboxID != 1:
		t.Fatalf("record %d came back, want record 1", r1.OutboxID)
	case !refused && r1.Err != nil:
		t.Fatalf("record 1: %v, want acknowledged (the broker appended it before the topic was deleted)", r1.Err)
	case refused && !errors.Is(r1.Err, ErrPoison):
		t.Fatalf("record 1: %v, want poison (its topic was deleted)", r1.Err)
	}
	// Later records of the topic fail at once, as poison.
	sendAll(t, p, rec(3, "t", keyP0))
	if r := results(t, p, 1)[0]; !errors.Is(r.Err, ErrPoison) && !errors.Is(r.Err, errPartitionStopped) {
		t.Fatalf("record 3: %v, want refused", r.Err)
	}
}

// A first lookup that calls a topic unknown is not the end: the topic is
// looked up again for UnknownTopicTimeout, and a topic that appears within
// it (a broker that had not caught up) takes the record.
func TestKafkaProducerUnknownTopicRetriedUntilItAppears(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.UnknownTopicTimeout = 10 * time.Second
	p := newTestProducer(t, cfg)
	var lookups atomic.Int32
	f.c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	sendAll(t, p, rec(1, "late", "a"))
	waitFor(t, func() bool { return lookups.Load() >= 2 }) // "unknown" at least once
	if err := f.c.CreateTopic("late", 1, nil); err != nil {
		t.Fatal(err)
	}
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record to a topic created after the first lookup: %v, want acknowledged", r.Err)
	}
}

// A partition count change is noticed by the periodic refresh. Records
// already routed by the old count are acknowledged before any record is
// routed by the new one: a key that moves to another partition never has a
// later event appended before an earlier one.
func TestKafkaProducerPartitionCountChangeDrainsFirst(t *testing.T) {
	f := startFakeKafkaBrokers(t, 2, 1, "t")
	var lookups atomic.Int32
	f.c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.MetadataRefresh = 5 * time.Millisecond
	p := newTestProducer(t, cfg)
	held, release := holdResponses(p, "t", 0)
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	key := keyFor(t, 1, 2) // partition 0 of 1, partition 1 of 2
	sendAll(t, p, rec(1, "t", key))
	<-held
	req := kmsg.NewCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = "t", 2
	req.Topics = append(req.Topics, rt)
	cl := newKgoClient(t, f.c.ListenAddrs())
	if _, err := req.RequestWith(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	// The new partition on the other broker, which is free to take it.
	if err := f.c.MoveTopicPartition("t", 1, 1-f.c.LeaderFor("t", 0)); err != nil {
		t.Fatal(err)
	}
	// Two refreshes after the change: the first answer was handled.
	n := lookups.Load()
	waitFor(t, func() bool { return lookups.Load() >= n+2 })
	sendAll(t, p, rec(2, "t", key))
	n = lookups.Load()
	waitFor(t, func() bool { return lookups.Load() >= n+2 })
	if got := len(f.log.all()); got != 1 {
		t.Fatalf("%d batches sent while record 1 was unacknowledged, want 1: record 2 overtook it", got)
	}
	releaseOnce.Do(func() { close(release) })
	rs := results(t, p, 2)
	if rs[0].OutboxID != 1 || rs[1].OutboxID != 2 || rs[0].Err != nil || rs[1].Err != nil {
		t.Fatalf("results %d (%v), %d (%v): want 1 then 2, acknowledged", rs[0].OutboxID, rs[0].Err, rs[1].OutboxID, rs[1].Err)
	}
	if rs[0].Partition != 0 || rs[1].Partition != 1 {
		t.Fatalf("partitions %d, %d: want 0 (old count) then 1 (new count)", rs[0].Partition, rs[1].Partition)
	}
}

func newKgoClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// In dead-letter mode, a batch the broker answered "unknown topic" (the
// topic deleted after its metadata was known) waits to be sent again; once
// the lookups call the topic missing, that batch is poison too. Before, only
// the queue was: the waiting batch was never answered and the pipeline
// waited on it for good.
func TestKafkaProducerWaitingBatchOfAMissingTopicIsPoison(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.ContinueAfterPoison = true
	cfg.UnknownTopicTimeout = 200 * time.Millisecond
	p := newTestProducer(t, cfg)
	sendAll(t, p, rec(1, "t", "a"))
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record 1: %v", r.Err)
	}
	if err := f.c.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	sendAll(t, p, rec(2, "t", "a"))                                                // to the known leader: "unknown topic", then waits
	if r := results(t, p, 1)[0]; r.OutboxID != 2 || !errors.Is(r.Err, ErrPoison) { // fails after 10 s unanswered
		t.Fatalf("record %d: %v, want record 2 poison (its topic is gone)", r.OutboxID, r.Err)
	}
}
