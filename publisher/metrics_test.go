package publisher

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// value reads a gauge.
func value(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}

func TestMetricsLagFollowsTheOldestUnconfirmedTransaction(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := outbox.NewMetrics(reg)
	now := time.Now()
	if got := m.Lag(now); got != 0 {
		t.Fatalf("lag before any pipeline %s, want 0", got)
	}
	p := NewPipeline(DefaultConfig(), zap.NewNop(), nil, nil, nil, 100, m)
	t1 := p.wm.Begin(now.Add(-5 * time.Second))
	t2 := p.wm.Begin(now.Add(-2 * time.Second))
	if got := m.Lag(now); got != 5*time.Second {
		t.Fatalf("lag %s, want 5s (oldest of two in flight)", got)
	}
	m.Standby.Set(1)
	if got := m.Lag(now); got != 0 {
		t.Fatalf("lag while standby %s, want 0", got)
	}
	m.Standby.Set(0)
	if got := value(t, m.Standby); got != 0 {
		t.Fatalf("standby gauge %v", got)
	}
	p.wm.Commit(t1, 200)
	if got := m.Lag(now); got != 2*time.Second {
		t.Fatalf("lag after the oldest was confirmed %s, want 2s", got)
	}
	p.wm.Commit(t2, 300)
	if got := m.Lag(now); got != 0 {
		t.Fatalf("lag with nothing in flight %s, want 0", got)
	}
	if got := value(t, m.LagSeconds); got != 0 {
		t.Fatalf("outboxd_lag_seconds %v, want 0", got)
	}

	// Lag bytes: from whichever confirmed position is ahead.
	m.ObserveSlot(outbox.SlotPoll{ServerWAL: 1000, SlotConfirmed: 250, RestartLSN: 100})
	if got := value(t, m.LagBytes); got != 700 {
		t.Fatalf("lag bytes %v, want 700 (own watermark 300 is ahead of the slot's 250)", got)
	}
	if got := value(t, m.SlotRetainedWALBytes); got != 900 {
		t.Fatalf("retained %v, want 900", got)
	}
	m.ObserveSlot(outbox.SlotPoll{ServerWAL: 1000, SlotConfirmed: 1000, RestartLSN: 0})
	if got := value(t, m.LagBytes); got != 0 {
		t.Fatalf("lag bytes %v, want 0", got)
	}
	if got := value(t, m.SlotRetainedWALBytes); got != 0 {
		t.Fatalf("retained with a lost slot %v, want 0", got)
	}
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 21 { // 27, less the five per-topic vectors not yet used and the safe WAL size (NULL: no series)
		t.Fatalf("gathered %d metric families, err %v; want 21", len(mfs), err)
	}
}

// histogram reads a histogram's count and sum.
func histogram(t *testing.T, h prometheus.Metric) (uint64, float64) {
	t.Helper()
	var d dto.Metric
	if err := h.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount(), d.GetHistogram().GetSampleSum()
}

// The two latency histograms split commit → Kafka at outboxd's reader: an
// event counts in commit → receive when the pipeline takes it, and in
// commit → ack only when Kafka acknowledged it.
func TestMetricsSplitCommitToAckAtTheReader(t *testing.T) {
	m := outbox.NewMetrics(prometheus.NewRegistry())
	prod := newFakeProducer()
	p := NewPipeline(DefaultConfig(), zap.NewNop(), prod, nil, nil, 100, m)
	in := make(chan replication.Message, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, in) }()

	// Read off the connection 2 s after the commit, then queued in outboxd
	// for a while: only the 2 s count as the PostgreSQL side.
	committed := time.Now().Add(-10 * time.Second)
	in <- replication.Message{Kind: replication.KindBegin, Begin: replication.Begin{CommitTime: committed, Received: committed.Add(2 * time.Second)}}
	in <- event(1, "a", "t")
	in <- commit(2000)
	var r *kafka.Record
	select {
	case r = <-prod.sentCh:
	case <-time.After(5 * time.Second):
		t.Fatal("no record sent")
	}
	if n, sum := histogram(t, m.CommitToReceive); n != 1 || sum != 2 {
		t.Fatalf("commit → receive: %d observations, sum %.3fs; want 1 of 2s", n, sum)
	}
	if n, _ := histogram(t, m.CommitToAck); n != 0 {
		t.Fatalf("commit → ack observed %d times before Kafka acknowledged", n)
	}
	prod.ack(r)
	for deadline := time.Now().Add(5 * time.Second); p.Confirmed() != 2000; {
		if time.Now().After(deadline) {
			t.Fatalf("not confirmed: %d", p.Confirmed())
		}
		time.Sleep(time.Millisecond)
	}
	if n, sum := histogram(t, m.CommitToAck); n != 1 || sum < 10 {
		t.Fatalf("commit → ack: %d observations, sum %.3fs; want 1 of at least 10s", n, sum)
	}
	close(in)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
