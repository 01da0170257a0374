package publisher

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
)

// The supervisor's rules (when a session restarts, from where, how soon,
// and when the service halts or waits as a standby), tested with a fake slot
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
