package publisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// The supervisor's rules (when a session restarts, from where, how soon,
// and when the service halts or waits as a standby); the harness is in
// service_harness_test.go.

// Rule: a produce failure restarts the session from the last confirmed
// position (not from the start, not past the failed event), counted as a
// "kafka" restart.
func TestServiceProduceFailureRestartsFromLastConfirmedPosition(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	srv.commit(0x200, event(2, "a", "t"))
	h := newSvcHarness(t, srv, newSvcKafka(failIn(2, 0)))
	h.start(svcConfig())
	h.waitSlotConfirmed(0x200)
	if got, want := srv.startLSNs(), []pglogrepl.LSN{0x10, 0x100}; !slices.Equal(got, want) {
		t.Errorf("sessions started at %v, want %v", got, want)
	}
	if got, want := h.kafka.sentIDs(), []int64{1, 2, 2}; !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v", got, want)
	}
	h.wantRestarts(map[string]float64{"kafka": 1})
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// failingHook fails AfterPublish while fail is set.
type failingHook struct{ fail bool }

func (f *failingHook) AfterPublish(context.Context, *kafka.Record) error {
	if f.fail {
		return fmt.Errorf("%w: update orders: connection reset", outbox.ErrHook)
	}
	return nil
}

// Rule: each restart is counted under its cause: Kafka (a produce failure or
// a producer that cannot connect) as "kafka", Postgres (the stream fails, or
// cannot be opened) as "postgres", a post-publish hook as "hook".
func TestServiceCountsRestartsByCause(t *testing.T) {
	boom := errors.New("connection reset by peer")
	for _, tc := range []struct {
		name   string
		cause  string
		script func(h *svcHarness)
	}{
		{"produce failure", "kafka", func(h *svcHarness) {
			h.kafka.policy = failIn(1, 0)
		}},
		{"producer cannot connect", "kafka", func(h *svcHarness) {
			var calls atomic.Int32
			h.deps.NewProducer = func(id Identity) (outbox.Producer, error) {
				if calls.Add(1) == 1 {
					return nil, boom
				}
				return h.kafka.newProducer(id)
			}
		}},
		{"dead-letter producer cannot connect", "kafka", func(h *svcHarness) {
			var calls atomic.Int32
			h.deps.NewDeadLetterer = func() (outbox.DeadLetterer, error) {
				if calls.Add(1) == 1 {
					return nil, boom
				}
				return &fakeDLQ{}, nil
			}
		}},
		{"stream fails", "postgres", func(h *svcHarness) {
			h.srv.runErr = func(session int) error {
				if session == 0 {
					return boom
				}
				return nil
			}
		}},
		{"stream cannot be opened", "postgres", func(h *svcHarness) {
			h.srv.onOpen = func(_ context.Context, attempt int) error {
				if attempt == 0 {
					return boom
				}
				return nil
			}
		}},
		{"hook fails", "hook", func(h *svcHarness) {
			var calls atomic.Int32
			h.deps.NewHook = func(context.Context) (outbox.Hook, error) {
				return &failingHook{fail: calls.Add(1) == 1}, nil
			}
		}},
		{"hook cannot connect", "hook", func(h *svcHarness) {
			var calls atomic.Int32
			h.deps.NewHook = func(context.Context) (outbox.Hook, error) {
				if calls.Add(1) == 1 {
					return nil, boom
				}
				return &failingHook{}, nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeServer(0x10)
			srv.commit(0x100, event(1, "a", "t"))
			h := newSvcHarness(t, srv, newSvcKafka(nil))
			tc.script(h)
			h.start(svcConfig())
			h.waitSlotConfirmed(0x100)
			h.wantRestarts(map[string]float64{tc.cause: 1})
			if err := h.stop(); err != nil {
				t.Fatalf("Run() = %v after a stop", err)
			}
		})
	}
}

// Rule (per-key order survives a failure): when record n fails and record
// n+1 of the same key (same partition) is acknowledged, n+1's transaction
// is not confirmed; the restart sends n then n+1 again, in that order, and
// then everything is confirmed.
func TestServiceLaterRecordAckedAfterAFailedOneIsNotConfirmed(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "k", "t"))
	srv.commit(0x200, event(2, "k", "t"))
	h := newSvcHarness(t, srv, newSvcKafka(func(s int, r *kafka.Record) (fate, error) {
		if s == 0 {
			return manual, nil
		}
		return ack, nil
	}))
	h.start(svcConfig())
	n, n1 := h.nextManual(), h.nextManual()
	if n.r.OutboxID != 1 || n1.r.OutboxID != 2 {
		t.Fatalf("sent %d, %d; want 1, 2", n.r.OutboxID, n1.r.OutboxID)
	}
	n1.p.ack(n1.r)
	waitUntil(t, "the ack of n+1 to be handled", func() bool { return gauge(t, h.m.InFlightEvents) == 1 })
	if got := gauge(t, h.m.ConfirmedLSN); got != 0x10 {
		t.Fatalf("confirmed %#x with n unacknowledged, want 0x10", uint64(got))
	}
	n.p.fail(n.r, errNotEnoughReplicas(n.r))
	h.waitSlotConfirmed(0x200)
	for _, lsn := range srv.seenBy(0) {
		if lsn != 0x10 {
			t.Errorf("the failed session confirmed %s, want nothing past 0/10", lsn)
		}
	}
	if got, want := srv.startLSNs(), []pglogrepl.LSN{0x10, 0x10}; !slices.Equal(got, want) {
		t.Errorf("sessions started at %v, want %v", got, want)
	}
	if got, want := h.kafka.sentIDs(), []int64{1, 2, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("sent %v, want %v: n then n+1, twice", got, want)
	}
	h.wantRestarts(map[string]float64{"kafka": 1})
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// backoffs are the waits logged before each restart.
func (h *svcHarness) backoffs() []time.Duration {
	var ds []time.Duration
	for _, e := range h.logs.FilterMessage("restarting pipeline from the last confirmed position").All() {
		d, ok := e.ContextMap()["backoff"].(time.Duration)
		if !ok {
			h.t.Fatalf("restart log without a backoff field: %v", e.ContextMap())
		}
		ds = append(ds, d)
	}
	return ds
}

// Rule: the backoff doubles while sessions fail without delivering anything,
// and starts over from the minimum after a session that delivered events (a
// new failure is not the same outage again).
func TestServiceBackoffStartsOverAfterASessionThatDeliveredEvents(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	srv.commit(0x200, event(2, "a", "t"))
	// Sessions 0-2 fail on event 1 (nothing delivered); session 3 delivers
	// event 1, then fails on event 2; session 4 fails on event 2 again
	// (nothing delivered); session 5 delivers.
	kafka := newSvcKafka(func(s int, r *kafka.Record) (fate, error) {
		if (s <= 2 && r.OutboxID == 1) || ((s == 3 || s == 4) && r.OutboxID == 2) {
			return fail, errNotEnoughReplicas(r)
		}
		return ack, nil
	})
	h := newSvcHarness(t, srv, kafka)
	cfg := svcConfig()
	cfg.RestartBackoffMax = time.Hour
	h.start(cfg)
	h.waitSlotConfirmed(0x200)
	ms := time.Millisecond
	got, want := h.backoffs(), []time.Duration{1 * ms, 2 * ms, 4 * ms, 1 * ms, 2 * ms}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		// each step, less at most 20 % of jitter
		ok = got[i] <= want[i] && got[i] >= want[i]*8/10
	}
	if !ok {
		t.Errorf("backoffs %v, want %v less at most 20%% jitter", got, want)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// slotHeldBy makes OpenSource fail as replication.Open does while the
// process pid streams from the slot (0: the slot is free).
func slotHeldBy(pid *atomic.Int64) func(context.Context, int) error {
	return func(context.Context, int) error {
		if p := pid.Load(); p != 0 {
			return &replication.SlotInUseError{Slot: "outboxd", PID: int(p)}
		}
		return nil
	}
}

// heldSlotHarness is a service over a slot with one event whose slot process
// 4242 holds until holder is set to 0.
func heldSlotHarness(t *testing.T) (*fakeServer, *atomic.Int64, *svcHarness) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	holder := new(atomic.Int64)
	holder.Store(4242)
	srv.onOpen = slotHeldBy(holder)
	return srv, holder, newSvcHarness(t, srv, newSvcKafka(nil))
}

// Rule: while another process holds the slot the service is a standby
// (State, the Standby gauge) and says so once, not on every poll; when the
// slot frees up it takes over and streams. Waiting as a standby is not a
// restart.
func TestServiceWaitsAsStandbyWhileAnotherProcessHoldsTheSlot(t *testing.T) {
	srv, holder, h := heldSlotHarness(t)
	h.start(svcConfig())
	waitUntil(t, "several standby polls", func() bool { return srv.numOpens() >= 5 })
	if st := h.svc.State(); st != outbox.StateStandby {
		t.Fatalf("State() = %s while another process holds the slot, want standby", st)
	}
	if g := gauge(t, h.m.Standby); g != 1 {
		t.Errorf("Standby gauge %v, want 1", g)
	}
	holder.Store(0)
	h.waitSlotConfirmed(0x100)
	if st := h.svc.State(); st != outbox.StateStreaming {
		t.Errorf("State() = %s after taking over, want streaming", st)
	}
	if g := gauge(t, h.m.Standby); g != 0 {
		t.Errorf("Standby gauge %v after taking over, want 0", g)
	}
	if n := h.countLogs("standby"); n != 1 {
		t.Errorf("logged standby %d times over %d polls, want once", n, srv.numOpens()-1)
	}
	if n := h.countLogs("taking over"); n != 1 {
		t.Errorf("logged taking over %d times, want once", n)
	}
	h.wantRestarts(nil)
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// Rule: a standby takes over as soon as AwaitSlotRelease sees the holder
// let go, not a standby poll interval later (here an hour: without the
// release check the takeover below never happens).
func TestServiceStandbyTakesOverWhenTheSlotIsReleased(t *testing.T) {
	srv, holder, h := heldSlotHarness(t)
	waiting := make(chan int, 1)
	released := make(chan struct{})
	h.deps.AwaitSlotRelease = func(ctx context.Context, slot string, pid int) error {
		select {
		case waiting <- pid:
		default:
		}
		select {
		case <-released:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cfg := svcConfig()
	cfg.StandbyPollInterval = time.Hour
	h.start(cfg)
	select {
	case pid := <-waiting:
		if pid != 4242 {
			t.Fatalf("AwaitSlotRelease waited for PID %d, want the holder 4242", pid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the standby never waited for the slot's release")
	}
	holder.Store(0)
	close(released)
	h.waitSlotConfirmed(0x100)
	if n := srv.numOpens(); n != 2 {
		t.Errorf("%d opens, want 2 (held, then taken over)", n)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// Rule: a slot still held by our own previous session's walsender (it has
// not exited yet) is not another process: no standby, just retry.
func TestServiceSlotHeldByOurOwnPreviousWalsenderIsNotStandby(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	srv.onOpen = func(_ context.Context, attempt int) error {
		if attempt >= 1 && attempt <= 3 {
			// Session 0's walsender (BackendPID 100) lingers.
			return &replication.SlotInUseError{Slot: "outboxd", PID: 100}
		}
		return nil
	}
	h := newSvcHarness(t, srv, newSvcKafka(failIn(1, 0)))
	h.start(svcConfig())
	h.waitSlotConfirmed(0x100)
	if n := srv.numOpens(); n != 5 {
		t.Errorf("%d opens, want 5", n)
	}
	if n := h.countLogs("standby"); n != 0 {
		t.Errorf("logged standby %d times for our own walsender", n)
	}
	if n := h.countLogs("taking over"); n != 0 {
		t.Errorf("logged taking over %d times for our own walsender", n)
	}
	h.wantRestarts(map[string]float64{"kafka": 1})
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
}

// Rule: errors a restart cannot fix halt Run with the error: a poison event
// without a dead-letter topic, a missing slot, an outbox table the decoder
// cannot read. Nothing past them is confirmed and nothing restarts.
func TestServiceHaltsOnFatalErrors(t *testing.T) {
	missing := fmt.Errorf("%w: replication slot %q does not exist", replication.ErrSlotMissing, "outboxd")
	for _, tc := range []struct {
		name   string
		want   error
		script func(h *svcHarness)
	}{
		{"poison without dead-letter topic", kafka.ErrPoison, func(h *svcHarness) {
			h.kafka.policy = func(_ int, r *kafka.Record) (fate, error) {
				return fail, &kafka.PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Err: sarama.ErrMessageSizeTooLarge}
			}
		}},
		{"slot missing at open", replication.ErrSlotMissing, func(h *svcHarness) {
			h.srv.onOpen = func(context.Context, int) error { return missing }
		}},
		{"slot dropped while streaming", replication.ErrSlotMissing, func(h *svcHarness) {
			h.srv.runErr = func(int) error { return missing }
		}},
		{"outbox table unreadable", replication.ErrMissingColumn, func(h *svcHarness) {
			h.srv.runErr = func(int) error {
				return fmt.Errorf("%w: outbox table has no column \"payload\"", replication.ErrMissingColumn)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeServer(0x10)
			srv.commit(0x100, event(1, "a", "t"))
			h := newSvcHarness(t, srv, newSvcKafka(nil))
			tc.script(h)
			h.start(svcConfig())
			err := h.result()
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run() = %v, want %v", err, tc.want)
			}
			if st := h.svc.State(); st != outbox.StateHalted {
				t.Errorf("State() = %s after a halt, want halted", st)
			}
			if n := srv.numOpens(); n != 1 {
				t.Errorf("%d opens, want 1: a fatal error does not restart", n)
			}
			h.wantRestarts(nil)
			if tc.want == kafka.ErrPoison {
				if got := srv.slotConfirmed(); got != 0x10 {
					t.Errorf("slot confirmed %s past a poison event", got)
				}
			}
		})
	}
}

// Rule (the contrast): with a dead-letter topic a poison event is diverted
// and confirmed; the service does not halt.
func TestServicePoisonWithDeadLetterTopicDoesNotHalt(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	h := newSvcHarness(t, srv, newSvcKafka(func(_ int, r *kafka.Record) (fate, error) {
		return fail, &kafka.PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Err: sarama.ErrMessageSizeTooLarge}
	}))
	dlq := &fakeDLQ{}
	h.deps.NewDeadLetterer = func() (outbox.DeadLetterer, error) { return dlq, nil }
	cfg := svcConfig()
	cfg.DeadLetterTopic = "dlq"
	h.start(cfg)
	h.waitSlotConfirmed(0x100)
	if err := h.stop(); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
	if len(dlq.got) != 1 || dlq.got[0].OutboxID != 1 {
		t.Errorf("dead-lettered %v, want outbox id 1", dlq.got)
	}
	h.wantRestarts(nil)
}
