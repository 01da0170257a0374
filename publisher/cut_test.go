package publisher

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// startCut runs a pipeline (with checkpoints, in mode) on a stream that
// delivered msgs and then closed, as a failed replication connection
// closes it: every record is acknowledged as it is sent, so nothing but the
// cut decides what is committed and confirmed. msgs are queued before Run
// starts, so the reader sees each commit with more to come and groups the
// transactions into one Kafka transaction, as it does under load.
func startCut(t *testing.T, mode string, msgs ...replication.Message) (*cpHarness, error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Delivery = mode
	cfg.CheckpointInterval = time.Hour
	h := &cpHarness{t: t, prod: &fakeTxnProducer{fakeProducer: newFakeProducer(), commits: make(chan struct{}, 10)},
		in: make(chan replication.Message, len(msgs)), err: make(chan error, 1)}
	h.p = NewPipeline(cfg, zap.NewNop(), h.prod, nil, nil, 1000, nil)
	if err := h.p.useCheckpoints(newCheckpointing("cp", testID, nil, 1000)); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		h.in <- m
	}
	close(h.in)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for {
			select {
			case r := <-h.prod.sentCh:
				h.prod.ack(r)
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { h.err <- h.p.Run(ctx, h.in) }()
	select {
	case err := <-h.err:
		return h, err
	case <-time.After(10 * time.Second):
		t.Fatal("the pipeline did not return after its stream closed")
		return nil, nil
	}
}

// Two transactions: the first complete (end 1200), the second cut after
// its first row.
func cutStream() []replication.Message {
	return []replication.Message{
		beginAt(1100), event(1, "a", "t"), event(2, "b", "t"), commit(1200),
		beginAt(1300), event(3, "a", "t"),
	}
}

// Rule (exactly-once): a stream that ends inside a PostgreSQL transaction
// commits none of it. The open Kafka transaction holds rows of the cut one,
// so it is not committed (the session aborts it), and nothing is confirmed;
// the restart sends both transactions again, and a read_committed reader
// sees each row once.
func TestExactlyOnceStreamCutInsideATransactionCommitsNothing(t *testing.T) {
	h, err := startCut(t, ExactlyOnce, cutStream()...)
	select {
	case <-h.prod.commits:
		t.Fatal("the Kafka transaction holding part of the cut PostgreSQL transaction was committed")
	default:
	}
	if !errors.Is(err, errStreamCut) {
		t.Fatalf("Run = %v, want the cut stream named (errStreamCut)", err)
	}
	if got := h.p.Gate().Confirmable(1400); got != 1000 || h.p.Confirmed() != 1000 {
		t.Fatalf("confirmable %d, confirmed %d after the cut; want 1000 (nothing)", got, h.p.Confirmed())
	}
}

// Rule (at-least-once): a stream that ends inside a PostgreSQL transaction
// confirms none of it, but keeps the transactions before it: the checkpoint
// covers the complete one, not the cut one.
func TestAtLeastOnceStreamCutInsideATransactionConfirmsNoneOfIt(t *testing.T) {
	h, err := startCut(t, AtLeastOnce, cutStream()...)
	if !errors.Is(err, errStreamCut) {
		t.Fatalf("Run = %v, want the cut stream named (errStreamCut)", err)
	}
	if got := h.p.Gate().Confirmable(1400); got != 1200 || h.p.Confirmed() != 1200 {
		t.Fatalf("confirmable %d, confirmed %d after the cut; want 1200 (the complete transaction only)", got, h.p.Confirmed())
	}
}

// Rule: a stream that ends between transactions is a clean end: what is in
// flight is finished and committed.
func TestExactlyOnceStreamEndingBetweenTransactionsCommitsWhatIsDone(t *testing.T) {
	h, err := startCut(t, ExactlyOnce, beginAt(1100), event(1, "a", "t"), commit(1200))
	if err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got := h.p.Confirmed(); got != 1200 {
		t.Fatalf("confirmed %d, want 1200", got)
	}
}
