package publisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// The supervisor's rules (issue 9 part 5), tested with a fake slot
// (fakeServer/fakeSource) and a fake Kafka (svcKafka/svcProducer). Every
// wait is for a condition, bounded by waitTimeout.

const waitTimeout = 5 * time.Second

// svcConfig has tiny backoffs so that restarts take milliseconds.
func svcConfig() Config {
	cfg := DefaultConfig()
	cfg.RestartBackoffMin = time.Millisecond
	cfg.RestartBackoffMax = 4 * time.Millisecond
	cfg.StandbyPollInterval = time.Millisecond
	cfg.ShutdownTimeout = waitTimeout
	return cfg
}

type svcHarness struct {
	t      *testing.T
	srv    *fakeServer
	kafka  *svcKafka
	m      *outbox.Metrics
	logs   *observer.ObservedLogs
	deps   Deps
	svc    *Service
	cancel context.CancelFunc
	errc   chan error
}

func newSvcHarness(t *testing.T, srv *fakeServer, kafka *svcKafka) *svcHarness {
	return &svcHarness{
		t: t, srv: srv, kafka: kafka, m: outbox.NewMetrics(nil),
		deps: Deps{OpenSource: srv.open, NewProducer: kafka.newProducer},
		errc: make(chan error, 2),
	}
}

// start runs the service with cfg; deps may be adjusted before.
func (h *svcHarness) start(cfg Config) {
	h.t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	h.svc = NewService(cfg, zap.New(core), h.m, h.deps)
	if st := h.svc.State(); st != outbox.StateStarting {
		h.t.Fatalf("State() before Run = %s, want starting", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-h.errc:
		case <-time.After(waitTimeout):
			h.t.Error("Run did not return at cleanup")
		}
	})
	go func() {
		err := h.svc.Run(ctx)
		h.errc <- err
		h.errc <- err // once for the test, once for the cleanup
	}()
}

// result waits for Run to return.
func (h *svcHarness) result() error {
	h.t.Helper()
	select {
	case err := <-h.errc:
		return err
	case <-time.After(waitTimeout):
		h.t.Fatal("Run did not return")
		return nil
	}
}

// stop cancels Run's context and waits for it to return.
func (h *svcHarness) stop() error {
	h.t.Helper()
	h.cancel()
	return h.result()
}

func (h *svcHarness) restarts(cause string) float64 {
	h.t.Helper()
	var d dto.Metric
	if err := h.m.Restarts.WithLabelValues(cause).Write(&d); err != nil {
		h.t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

// wantRestarts checks every restart cause counter.
func (h *svcHarness) wantRestarts(want map[string]float64) {
	h.t.Helper()
	for _, c := range []string{"kafka", "postgres", "hook", "other"} {
		if got := h.restarts(c); got != want[c] {
			h.t.Errorf("Restarts{cause=%q} = %v, want %v", c, got, want[c])
		}
	}
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}

// countLogs counts the log entries whose message starts with prefix.
func (h *svcHarness) countLogs(prefix string) int {
	n := 0
	for _, e := range h.logs.All() {
		if strings.HasPrefix(e.Message, prefix) {
			n++
		}
	}
	return n
}

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func (h *svcHarness) waitSlotConfirmed(want pglogrepl.LSN) {
	h.t.Helper()
	waitUntil(h.t, fmt.Sprintf("slot confirmed at %s", want), func() bool { return h.srv.slotConfirmed() == want })
}

func (h *svcHarness) nextManual() sentRecord {
	h.t.Helper()
	select {
	case s := <-h.kafka.manual:
		return s
	case <-time.After(waitTimeout):
		h.t.Fatal("no record sent")
		return sentRecord{}
	}
}

func errNotEnoughReplicas(r *kafka.Record) error {
	return &kafka.ProduceError{OutboxID: r.OutboxID, Topic: r.Topic, Err: sarama.ErrNotEnoughReplicas}
}

// failIn fails the record with outbox id in the given sessions and
// acknowledges everything else.
func failIn(id int64, sessions ...int) func(int, *kafka.Record) (fate, error) {
	return func(s int, r *kafka.Record) (fate, error) {
		if r.OutboxID == id && slices.Contains(sessions, s) {
			return fail, errNotEnoughReplicas(r)
		}
		return ack, nil
	}
}

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
			h.deps.NewProducer = func(id Identity) (Producer, error) {
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

// Rule (issue 15): when record n fails and record n+1 of the same key (same
// partition) is acknowledged, n+1's transaction is not confirmed; the
// restart sends n then n+1 again, in that order, and then everything is
// confirmed.
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

// Rule: while another process holds the slot the service is a standby
// (State, the Standby gauge) and says so once, not on every poll; when the
// slot frees up it takes over and streams. Waiting as a standby is not a
// restart.
func TestServiceWaitsAsStandbyWhileAnotherProcessHoldsTheSlot(t *testing.T) {
	srv := newFakeServer(0x10)
	srv.commit(0x100, event(1, "a", "t"))
	var holder atomic.Int64
	holder.Store(4242)
	srv.onOpen = slotHeldBy(&holder)
	h := newSvcHarness(t, srv, newSvcKafka(nil))
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
			if st := h.svc.State(); st != outbox.StateStopped {
				t.Errorf("State() = %s after a halt, want stopped", st)
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
