package publisher

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// The pipeline end to end, in process and fast: the fake slot
// (fakeServer) → Service (gate, delivery mode, pipeline) → the real
// kafka.Producer → kfake, an in-process Kafka → a read_committed consumer.
// What the slot ends up confirming is checked against what Kafka holds.
// Until now this combination ran only in the slow tests of cmd/outboxd,
// against real servers.

func startKfake(t *testing.T, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func e2eKafkaConfig(brokers []string) kafka.Config {
	c := kafka.DefaultConfig()
	c.Brokers = brokers
	c.RetryBackoff = 2 * time.Millisecond
	c.RetryBackoffMax = 10 * time.Millisecond
	c.DeliveryTimeout = 5 * time.Second
	c.RequestTimeout = 2 * time.Second
	c.TransactionTimeout = time.Minute
	return c
}

// consume reads want records of topic (read_committed), as a consumer would.
func consume(t *testing.T, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	got := consumeUntil(t, brokers, topic, func(got []*kgo.Record) bool { return len(got) >= want })
	if len(got) != want {
		t.Fatalf("%d records in %s, want %d", len(got), topic, want)
	}
	return got
}

// consumeUntil reads topic (read_committed) until done says it has enough.
func consumeUntil(t *testing.T, brokers []string, topic string, done func([]*kgo.Record) bool) []*kgo.Record {
	t.Helper()
	// A short max wait: kfake can hold a first Fetch for its whole max wait
	// although committed records are there (see kafka's readCommitted).
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var got []*kgo.Record
	for !done(got) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
	}
	return got
}

// commitOrders commits n transactions of two events each (aggregates a
// and b) to srv, ending at 1000, 2000, ...; ids count from 1. The fake
// source adds each transaction's Begin and Commit.
func commitOrders(srv *fakeServer, n int) pglogrepl.LSN {
	var end pglogrepl.LSN
	for i := range n {
		end = pglogrepl.LSN(1000 * (i + 1))
		srv.commit(end, event(int64(2*i+1), "a", "orders"), event(int64(2*i+2), "b", "orders"))
	}
	return end
}

// checkOrders checks that every event is in Kafka once, with its key and
// outbox-id header, each aggregate's in commit order.
func checkOrders(t *testing.T, rs []*kgo.Record) {
	t.Helper()
	next := map[string]int64{"a": 1, "b": 2}
	for _, r := range rs {
		key := string(r.Key)
		var id string
		for _, h := range r.Headers {
			if h.Key == "outbox-id" {
				id = string(h.Value)
			}
		}
		if want := strconv.FormatInt(next[key], 10); id != want {
			t.Fatalf("aggregate %q: outbox-id %q, want %s (every event once, in commit order)", key, id, want)
		}
		next[key] += 2
	}
}

func TestEndToEndAtLeastOnceThroughKafka(t *testing.T) {
	brokers := startKfake(t, "orders")
	srv := newFakeServer(0)
	end := commitOrders(srv, 20)
	h := newSvcHarness(t, srv, nil)
	h.deps.NewProducer = func(Identity) (outbox.Producer, error) {
		return kafka.NewProducer(e2eKafkaConfig(brokers), zaptest.NewLogger(t), kafka.ProducerHooks{})
	}
	h.start(svcConfig())
	checkOrders(t, consume(t, brokers, "orders", 40))
	waitUntil(t, fmt.Sprintf("the slot confirmed %s", end), func() bool { return srv.slotConfirmed() == end })
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if n := h.restarts("other") + h.restarts("kafka") + h.restarts("postgres"); n != 0 {
		t.Fatalf("%v restarts, want none", n)
	}
}

// Exactly-once: the records become visible with their Kafka transaction,
// and the checkpoint topic holds the position the slot confirmed (the gate
// lets the slot go no further than the checkpoint).
func TestEndToEndExactlyOnceThroughKafka(t *testing.T) {
	brokers := startKfake(t, "orders", "cp")
	srv := newFakeServer(0)
	end := commitOrders(srv, 20)
	h := newSvcHarness(t, srv, nil)
	h.deps.NewProducer = func(id Identity) (outbox.Producer, error) {
		c := e2eKafkaConfig(brokers)
		c.TransactionalID = id.TransactionalID()
		return kafka.NewProducer(c, zaptest.NewLogger(t), kafka.ProducerHooks{})
	}
	h.deps.ReadCheckpoint = func(context.Context, Identity, []kafka.Barrier) (*Checkpoint, error) { return nil, nil }
	cfg := svcConfig()
	cfg.Delivery, cfg.CheckpointTopic = ExactlyOnce, "cp"
	h.start(cfg)
	checkOrders(t, consume(t, brokers, "orders", 40))
	waitUntil(t, fmt.Sprintf("the slot confirmed %s", end), func() bool { return srv.slotConfirmed() == end })
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	confirmed := srv.slotConfirmed()
	var written pglogrepl.LSN
	consumeUntil(t, brokers, "cp", func(rs []*kgo.Record) bool {
		for _, r := range rs {
			if r.Value == nil {
				continue // a session's read barrier (writeReadBarrier)
			}
			cp, err := ParseCheckpoint(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			written = max(written, cp.EndLSN)
		}
		return written >= confirmed
	})
	if written < confirmed {
		t.Fatalf("the slot confirmed %s, the checkpoint topic holds only %s", confirmed, written)
	}
}

// A session writes a read barrier to the checkpoint topic before it reads
// its checkpoint, and tells the read where it landed: the read must reach
// past it, so that a replaced leader still answering with its older log is
// never taken for the topic (kafka.ReadCompacted). The barrier is a
// tombstone under the identity's own barrier key.
func TestSessionReadsItsCheckpointPastTheBarrierItWrote(t *testing.T) {
	brokers := startKfake(t, "orders", "cp")
	srv := newFakeServer(0)
	commitOrders(srv, 5)
	h := newSvcHarness(t, srv, nil)
	h.deps.NewProducer = func(Identity) (outbox.Producer, error) {
		return kafka.NewProducer(e2eKafkaConfig(brokers), zaptest.NewLogger(t), kafka.ProducerHooks{})
	}
	type read struct {
		id      Identity
		barrier []kafka.Barrier
	}
	reads := make(chan read, 16)
	h.deps.ReadCheckpoint = func(_ context.Context, id Identity, barrier []kafka.Barrier) (*Checkpoint, error) {
		reads <- read{id, barrier}
		return nil, nil
	}
	cfg := svcConfig()
	cfg.CheckpointTopic = "cp"
	h.start(cfg)
	checkOrders(t, consume(t, brokers, "orders", 10))
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	var r read
	select {
	case r = <-reads:
	default:
		t.Fatal("the session never read its checkpoint")
	}
	if len(r.barrier) != 1 || r.barrier[0].Offset < 0 {
		t.Fatalf("ReadCheckpoint got the barrier %+v, want one record's position", r.barrier)
	}
	b := r.barrier[0]
	var found *kgo.Record
	consumeUntil(t, brokers, "cp", func(rs []*kgo.Record) bool {
		for _, rec := range rs {
			if rec.Partition == b.Partition && rec.Offset == b.Offset {
				found = rec
			}
		}
		return found != nil
	})
	if found == nil {
		t.Fatalf("no record at the barrier's position %+v in the checkpoint topic", b)
	}
	if string(found.Key) != r.id.Key()+"/read-barrier" || found.Value != nil {
		t.Fatalf("the record at the barrier is key %q value %q, want a tombstone under %q", found.Key, found.Value, r.id.Key()+"/read-barrier")
	}
}
