package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/halt"
)

// gauge reads a gauge's value (client_golang's testutil would add a module
// to go.mod for this one line).
func gauge(t *testing.T, g prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.GetCounter().GetValue()
	}
	return d.GetGauge().GetValue()
}

// states reads every outboxd_state series: label value → value.
func states(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, l := range stateLabels {
		out[l] = gauge(t, m.State.WithLabelValues(l))
	}
	return out
}

// wantOnly fails unless exactly the series named one is at 1 and the rest
// at 0.
func wantOnly(t *testing.T, what string, got map[string]float64, one string) {
	t.Helper()
	for l, v := range got {
		if want := map[bool]float64{true: 1, false: 0}[l == one]; v != want {
			t.Errorf("%s{%q} = %v, want %v (only %q at 1): %v", what, l, v, want, one, got)
		}
	}
}

func TestStateGaugeHasOneSeriesAtOne(t *testing.T) {
	t.Parallel()
	m := NewMetrics(nil)
	got := states(t, m)
	if len(got) != 6 {
		t.Fatalf("%d state series, want 6: %v", len(got), got)
	}
	wantOnly(t, "outboxd_state", got, "starting")
	for st, label := range map[State]string{
		StateStreaming: "active", StateStandby: "standby", StateRestarting: "restarting",
		StateHalted: "halted", StateStopped: "stopped", StateStarting: "starting",
	} {
		m.SetState(st)
		wantOnly(t, "outboxd_state", states(t, m), label)
	}
}

// The supervisor drives the gauge: active while a session runs, halted
// (not stopped) when Run returns an error that halts, stopped after a
// graceful stop.
func TestSupervisorReportsHaltedApartFromStopped(t *testing.T) {
	t.Parallel()
	cfg := SupervisorConfig{RestartBackoffMin: time.Millisecond, RestartBackoffMax: time.Millisecond, ShutdownTimeout: time.Second}

	m := NewMetrics(nil)
	s := NewSupervisor(cfg, zap.NewNop(), m)
	poison := fmt.Errorf("the event at 0/16B3748: %w", halt.New("poison event"))
	err := s.Run(context.Background(), func(_, _ context.Context) (bool, error) {
		s.Running()
		wantOnly(t, "outboxd_state while running", states(t, m), "active")
		return true, poison
	})
	if !errors.Is(err, poison) {
		t.Fatalf("Run() = %v, want the halt", err)
	}
	if st := s.State(); st != StateHalted {
		t.Errorf("State() = %s after a halt, want halted", st)
	}
	wantOnly(t, "outboxd_state after a halt", states(t, m), "halted")
	if got := gauge(t, m.Standby); got != 0 {
		t.Errorf("outboxd_standby = %v after a halt", got)
	}

	m = NewMetrics(nil)
	s = NewSupervisor(cfg, zap.NewNop(), m)
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Run(ctx, func(stop, _ context.Context) (bool, error) {
		s.Running()
		cancel()
		<-stop.Done()
		return true, nil
	}); err != nil {
		t.Fatalf("Run() = %v after a stop", err)
	}
	wantOnly(t, "outboxd_state after a stop", states(t, m), "stopped")
}

func slotStatuses(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, ws := range []string{"reserved", "extended", "unreserved", "lost", "missing"} {
		out[ws] = gauge(t, m.SlotWALStatus.WithLabelValues(ws))
	}
	return out
}

// safeWALSize is the exported safe WAL size, and whether there is a series.
func safeWALSize(t *testing.T, reg *prometheus.Registry) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "outboxd_slot_safe_wal_size_bytes" {
			if n := len(mf.GetMetric()); n != 1 {
				t.Fatalf("%d safe WAL size series, want 1", n)
			}
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func TestSlotGaugesFollowThePoll(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)

	// Before any poll: no status at 1 (so no alert fires on a process that
	// has not looked yet), no safe WAL size.
	wantOnly(t, "outboxd_slot_wal_status before a poll", slotStatuses(t, m), "")
	if _, ok := safeWALSize(t, reg); ok {
		t.Error("a safe WAL size before any poll")
	}

	safe := int64(64 << 20)
	m.ObserveSlot(SlotPoll{ServerWAL: 1000, SlotConfirmed: 900, RestartLSN: 800, Active: true, WALStatus: "reserved", SafeWALSize: &safe})
	if got := gauge(t, m.SlotActive); got != 1 {
		t.Errorf("outboxd_slot_active = %v, want 1", got)
	}
	wantOnly(t, "outboxd_slot_wal_status", slotStatuses(t, m), "reserved")
	if v, ok := safeWALSize(t, reg); !ok || v != float64(safe) {
		t.Errorf("safe WAL size = %v (exported %v), want %d", v, ok, safe)
	}

	// max_slot_wal_keep_size = -1: safe_wal_size is NULL, and the series goes.
	m.ObserveSlot(SlotPoll{ServerWAL: 1000, SlotConfirmed: 900, RestartLSN: 800, Active: false, WALStatus: "extended"})
	if got := gauge(t, m.SlotActive); got != 0 {
		t.Errorf("outboxd_slot_active = %v, want 0", got)
	}
	wantOnly(t, "outboxd_slot_wal_status", slotStatuses(t, m), "extended")
	if v, ok := safeWALSize(t, reg); ok {
		t.Errorf("safe WAL size %v exported for a NULL", v)
	}

	safe = 0
	m.ObserveSlot(SlotPoll{ServerWAL: 1000, WALStatus: "unreserved", SafeWALSize: &safe})
	wantOnly(t, "outboxd_slot_wal_status", slotStatuses(t, m), "unreserved")
	if v, ok := safeWALSize(t, reg); !ok || v != 0 {
		t.Errorf("safe WAL size = %v (exported %v), want 0", v, ok)
	}

	m.ObserveSlot(SlotPoll{ServerWAL: 1000, WALStatus: "lost"})
	wantOnly(t, "outboxd_slot_wal_status", slotStatuses(t, m), "lost")
	if _, ok := safeWALSize(t, reg); ok {
		t.Error("a safe WAL size for a lost slot")
	}

	m.ObserveSlot(SlotPoll{ServerWAL: 1000, Active: true, WALStatus: "reserved", SafeWALSize: &safe})
	m.SlotMissing()
	wantOnly(t, "outboxd_slot_wal_status of a missing slot", slotStatuses(t, m), "missing")
	if got := gauge(t, m.SlotActive); got != 0 {
		t.Errorf("outboxd_slot_active = %v for a missing slot, want 0", got)
	}
	if _, ok := safeWALSize(t, reg); ok {
		t.Error("a safe WAL size for a missing slot")
	}
	if got := gauge(t, m.SlotPolls.WithLabelValues("ok")); got != 6 {
		t.Errorf("ok polls = %v, want 6 (a missing slot is an answer)", got)
	}
	if got := gauge(t, m.SlotPolls.WithLabelValues("error")); got != 0 {
		t.Errorf("error polls = %v, want 0", got)
	}
}

func TestLastEventTimestampIsZeroUntilSet(t *testing.T) {
	t.Parallel()
	m := NewMetrics(nil)
	if got := gauge(t, m.LastEventTimestamp); got != 0 {
		t.Fatalf("outboxd_last_event_timestamp_seconds = %v before any event, want 0", got)
	}
	before := float64(time.Now().UnixNano()) / 1e9
	m.LastEventTimestamp.SetToCurrentTime()
	if got := gauge(t, m.LastEventTimestamp); got < before-1 || got > before+60 {
		t.Fatalf("outboxd_last_event_timestamp_seconds = %v, want about %v", got, before)
	}
}
