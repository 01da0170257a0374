package publisher

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Rule: a stop finishes the transaction in hand (its rest is delivered and
// produced), starts no new one, waits for the acknowledgements, confirms,
// and Run returns nil.
func TestServiceCleanStopFinishesTheTransactionInHandAndWaitsForAcks(t *testing.T) {
	srv := newFakeServer(0x10)
	gate, atGate := make(chan struct{}), make(chan struct{})
	srv.commitTxn(fakeTxn{end: 0x100, events: []replication.Message{event(1, "a", "t"), event(2, "b", "t")}, gate: gate, atGate: atGate})
	srv.commit(0x200, event(3, "a", "t"))
	h := newSvcHarness(t, srv, newSvcKafka(func(int, *kafka.Record) (fate, error) { return manual, nil }))
	h.start(svcConfig())
	select {
	case <-atGate: // the first event is out, the transaction in hand
	case <-time.After(5 * time.Second):
		t.Fatal("the transaction never reached its gate")
	}
	h.cancel()
	waitUntil(t, "the shutdown to begin", func() bool { return h.countLogs("shutting down") == 1 })
	close(gate)
	first, second := h.nextManual(), h.nextManual()
	if first.r.OutboxID != 1 || second.r.OutboxID != 2 {
		t.Fatalf("sent outbox ids %d, %d after the stop, want 1, 2 (the transaction in hand)", first.r.OutboxID, second.r.OutboxID)
	}
	select {
	case err := <-h.errc:
		t.Fatalf("Run() = %v before the acknowledgements", err)
	default:
	}
	first.p.ack(first.r)
	second.p.ack(second.r)
	if err := h.result(); err != nil {
		t.Fatalf("Run() = %v after a clean stop", err)
	}
	if got := srv.slotConfirmed(); got != 0x100 {
		t.Errorf("slot confirmed %s after the stop, want 0/100 (the finished transaction)", got)
	}
	if got, want := h.kafka.sentIDs(), []int64{1, 2}; !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v: no transaction begun after the stop", got, want)
	}
	if st := h.svc.State(); st != outbox.StateStopped {
		t.Errorf("State() = %s after Run returned, want stopped", st)
	}
	h.wantRestarts(nil)
}

// Rule: with acknowledgements never coming, a stop gives up after
// ShutdownTimeout — not before, not much after — and Run returns nil
// without confirming the unacknowledged events.
func TestServiceShutdownTimeoutBoundsTheWaitForAcks(t *testing.T) {
	const timeout = 150 * time.Millisecond
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	h := newSvcHarness(t, srv, newSvcKafka(func(int, *kafka.Record) (fate, error) { return hold, nil }))
	cfg := svcConfig()
	cfg.ShutdownTimeout = timeout
	h.start(cfg)
	waitUntil(t, "the record to be sent", func() bool { return len(h.kafka.sentIDs()) == 1 })
	t0 := time.Now()
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
	took := time.Since(t0)
	if took < timeout || took > timeout+time.Second {
		t.Errorf("Run returned %s after the stop, want %s (and not much more)", took, timeout)
	}
	if n := h.countLogs("shutdown timeout"); n != 1 {
		t.Errorf("logged the shutdown timeout %d times, want once", n)
	}
	if got := srv.slotConfirmed(); got != 0x10 {
		t.Errorf("slot confirmed %s with the event unacknowledged", got)
	}
}

// Rule: State() is streaming while a session runs, restarting between
// sessions (after a Kafka failure, and after a Postgres one, which the
// pipeline itself does not see), stopped after Run returns.
func TestServiceStateFollowsTheSessions(t *testing.T) {
	for _, cause := range []string{"kafka", "postgres"} {
		t.Run(cause, func(t *testing.T) {
			srv := newFakeServer(0x10)
			srv.commit(0x100, event(1, "a", "t"))
			reopening := make(chan struct{})
			release := make(chan struct{})
			srv.onOpen = func(ctx context.Context, attempt int) error {
				if attempt != 1 {
					return nil
				}
				close(reopening)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			var broken atomic.Bool
			kafka := newSvcKafka(nil)
			if cause == "kafka" {
				kafka.policy = failIn(2, 0)
			} else {
				srv.runErr = func(session int) error {
					if session == 0 && broken.Load() {
						return errors.New("connection reset by peer")
					}
					return nil
				}
			}
			h := newSvcHarness(t, srv, kafka)
			h.start(svcConfig())
			h.waitSlotConfirmed(0x100)
			if st := h.svc.State(); st != outbox.StateStreaming {
				t.Fatalf("State() = %s while a session runs, want streaming", st)
			}
			broken.Store(true)
			srv.commit(0x200, event(2, "a", "t")) // session 0 fails on it or after it
			select {
			case <-reopening:
			case <-time.After(waitTimeout):
				t.Fatal("no restart")
			}
			if st := h.svc.State(); st != outbox.StateRestarting {
				t.Fatalf("State() = %s between sessions, want restarting", st)
			}
			close(release)
			srv.commit(0x300, event(3, "a", "t"))
			h.waitSlotConfirmed(0x300)
			if st := h.svc.State(); st != outbox.StateStreaming {
				t.Fatalf("State() = %s after the restart, want streaming", st)
			}
			h.wantRestarts(map[string]float64{cause: 1})
			if err := h.stop(); err != nil {
				t.Fatalf("Run() = %v after a stop", err)
			}
			if st := h.svc.State(); st != outbox.StateStopped {
				t.Fatalf("State() = %s after Run returned, want stopped", st)
			}
		})
	}
}
