package publisher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// poison is how the producer fails a record Kafka refused for good.
func poison(r *kafka.Record, err error) error {
	return &kafka.PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Size: r.Size(), Err: err}
}

// batchingProducer is a fakeProducer that also takes batches, counting them.
type batchingProducer struct {
	*fakeProducer
	batches chan int
}

func (b *batchingProducer) SendBatch(ctx context.Context, rs []*kafka.Record) error {
	b.batches <- len(rs)
	for _, r := range rs {
		if err := b.Send(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// startBatchingPipeline runs a pipeline on an unbuffered input (each send
// returns once the pipeline took the message) and a producer that reports
// the size of every SendBatch.
func startBatchingPipeline(t *testing.T) (chan<- replication.Message, *batchingProducer, *Pipeline, <-chan error) {
	t.Helper()
	in := make(chan replication.Message)
	prod := &batchingProducer{fakeProducer: newFakeProducer(), batches: make(chan int, 100)}
	p := NewPipeline(DefaultConfig(), zap.NewNop(), prod, nil, nil, 1000, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, in) }()
	return in, prod, p, errc
}

// A transaction reaches the producer in one SendBatch at its commit, so its
// records share requests: also when its messages trickle in one by one with
// the reader's input empty in between (as when the reader keeps up with the
// walsender). Sent record by record, each would take a produce request of
// its own, and under load the requests alone saturated the broker.
func TestPipelineHandsATransactionToTheProducerAtItsCommit(t *testing.T) {
	in, prod, p, errc := startBatchingPipeline(t)
	in <- begin()
	for i := int64(1); i <= 10; i++ {
		in <- event(i, fmt.Sprintf("k%d", i), "t") // unbuffered: the reader took it
	}
	select {
	case n := <-prod.batches:
		t.Fatalf("a batch of %d records before the commit", n)
	default:
	}
	in <- commit(2000)
	select {
	case n := <-prod.batches:
		if n != 10 {
			t.Fatalf("first batch of %d records, want the transaction's 10 at once", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no batch sent")
	}
	for range 10 {
		prod.ack(<-prod.sentCh)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Confirmed() != 2000 {
		if time.Now().After(deadline) {
			t.Fatalf("Confirmed() = %d, want 2000", p.Confirmed())
		}
		time.Sleep(time.Millisecond)
	}
	close(in)
	if err := <-errc; err != nil {
		t.Fatalf("Run() = %v", err)
	}
}

// A transaction larger than maxPending goes out every maxPending records,
// before its commit arrives.
func TestPipelineHandsALargeTransactionOverInParts(t *testing.T) {
	in, prod, _, _ := startBatchingPipeline(t)
	in <- begin()
	for i := int64(1); i <= maxPending; i++ {
		in <- event(i, "k", "t")
	}
	select {
	case n := <-prod.batches:
		if n != maxPending {
			t.Fatalf("batch of %d records, want %d", n, maxPending)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no batch before the commit of a transaction past maxPending")
	}
}

// Records held back are sent before the reader waits for room: with room
// for one event in flight, a waiting three-event transaction still goes
// through (one at a time), never wedged behind its own unsent records.
func TestPipelineHeldBackRecordsGoOutBeforeWaitingForRoom(t *testing.T) {
	in := make(chan replication.Message, 100)
	in <- begin()
	for i := int64(1); i <= 3; i++ {
		in <- event(i, "a", "t")
	}
	in <- commit(2000)
	cfg := DefaultConfig()
	cfg.MaxInFlightEvents = 1
	prod := &batchingProducer{fakeProducer: newFakeProducer(), batches: make(chan int, 100)}
	p := NewPipeline(cfg, zap.NewNop(), prod, nil, nil, 1000, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx, in) }()
	for i := range 3 {
		select {
		case r := <-prod.sentCh:
			prod.ack(r)
		case <-time.After(5 * time.Second):
			t.Fatalf("record %d of 3 never sent: held back behind the in-flight limit", i+1)
		}
	}
}
