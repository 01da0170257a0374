package operations

// End-to-end tests of what operators see: /metrics, /healthz, /readyz and
// "outboxd status", against the real binary, PostgreSQL and Kafka.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

func TestRunMetricsMoveAndLagReturnsToZero(t *testing.T) {
	t.Parallel()
	// A PostgreSQL of its own: outboxd_lag_bytes is the server's WAL end
	// minus the slot's position, and on the shared server other tests' WAL
	// (one writes 2 MB/s) kept it near 2 MB when this one was idle.
	ps := testenv.StartPostgres(t)
	k := testenv.Kafka(t)
	e := &e2e.Env{T: t, DSN: ps.DSN, Brokers: k.Brokers, Topic: k.Topic(t, "e2e", 3), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	dlq := testenv.Kafka(t).Topic(t, "dlq", 1)
	// A linger makes Kafka acknowledge in batches every 700 ms: events stay
	// in flight long enough for the lag to be seen mid-run. One event over
	// --kafka-max-message-bytes goes to the dead-letter topic.
	d, base := e.StartWithMetrics("--slot-poll-interval", "200ms", "--kafka-linger", "700ms",
		"--dead-letter-topic", dlq, "--kafka-max-message-bytes", "100000")
	d.WaitLog("streaming", 60*time.Second)
	before := e2e.Scrape(t, base)
	topic := fmt.Sprintf(`{topic=%q}`, e.Topic)
	for _, s := range []string{"outboxd_standby", "outboxd_lag_seconds", "outboxd_in_flight_events", `outboxd_pipeline_restarts_total{cause="kafka"}`} {
		if v := e2e.One(t, before, s); v != 0 {
			t.Errorf("%s = %v before any event, want 0", s, v)
		}
	}

	const total = 3000
	writeDone := make(chan error, 1)
	go func() {
		writeDone <- e.Write(context.Background(), e2e.Load{Writers: 2, Aggregates: 40, Total: total, MaxTxn: 20, Pause: 5 * time.Millisecond})
	}()
	var maxLagSec, maxLagBytes, maxInFlight float64
	for writing := true; writing; {
		select {
		case err := <-writeDone:
			if err != nil {
				t.Fatal(err)
			}
			writing = false
		case <-time.After(100 * time.Millisecond):
		}
		m := e2e.Scrape(t, base)
		maxLagSec = max(maxLagSec, e2e.One(t, m, "outboxd_lag_seconds"))
		maxLagBytes = max(maxLagBytes, e2e.One(t, m, "outboxd_lag_bytes"))
		maxInFlight = max(maxInFlight, e2e.One(t, m, "outboxd_in_flight_events"))
	}

	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('big', $1, jsonb_build_object('pad', repeat('x', 200000)))`, e.Topic)

	// Idle: everything acknowledged, and the lag back to ~0.
	var m map[string]float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		m = e2e.Scrape(t, base)
		if m["outboxd_events_published_total"+topic] == total && m["outboxd_poison_events_diverted_total"+topic] == 1 &&
			m["outboxd_lag_seconds"] == 0 &&
			m["outboxd_lag_bytes"] < 64<<10 && m["outboxd_in_flight_events"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not idle 30 s after the last write: published %v of %d, lag %v s / %v bytes, in flight %v",
				m["outboxd_events_published_total"+topic], total, m["outboxd_lag_seconds"], m["outboxd_lag_bytes"], m["outboxd_in_flight_events"])
		}
		time.Sleep(200 * time.Millisecond)
	}
	var sample []string
	for k, v := range m {
		if strings.HasPrefix(k, "outboxd_") && !strings.Contains(k, "_bucket{") {
			sample = append(sample, fmt.Sprintf("%s %v", k, v))
		}
	}
	slices.Sort(sample)
	t.Logf("idle /metrics (outboxd_*, buckets left out):\n%s", strings.Join(sample, "\n"))
	t.Logf("during the run: max lag %.3f s, %.0f bytes, %.0f events in flight; idle: lag %.3f s, %.0f bytes, retained WAL %.0f bytes",
		maxLagSec, maxLagBytes, maxInFlight, m["outboxd_lag_seconds"], m["outboxd_lag_bytes"], m["outboxd_slot_retained_wal_bytes"])
	if maxLagSec <= 0 || maxLagBytes <= 0 || maxInFlight <= 0 {
		t.Errorf("lag and in-flight never moved during the run: %.3f s, %.0f bytes, %.0f events", maxLagSec, maxLagBytes, maxInFlight)
	}
	if got := e2e.One(t, m, "outboxd_bytes_published_total"+topic); got < total*50 {
		t.Errorf("bytes published %v, want ≥ %d", got, total*50)
	}
	if got := e2e.One(t, m, "outboxd_commit_to_ack_seconds_count"); got != total {
		t.Errorf("commit-to-ack histogram count %v, want %d", got, total)
	}
	if got := e2e.One(t, m, "outboxd_commit_to_ack_seconds_sum"); got <= 0 {
		t.Errorf("commit-to-ack histogram sum %v, want > 0", got)
	}
	if got := e2e.One(t, m, `outboxd_commit_to_ack_seconds_bucket{le="0.0005"}`); got >= total {
		t.Errorf("every ack within 0.5 ms despite a 700 ms linger: histogram not observing latency")
	}
	if m["outboxd_confirmed_lsn"] <= before["outboxd_confirmed_lsn"] || m["outboxd_received_lsn"] < m["outboxd_confirmed_lsn"] {
		t.Errorf("LSNs: confirmed %v (was %v), received %v", m["outboxd_confirmed_lsn"], before["outboxd_confirmed_lsn"], m["outboxd_received_lsn"])
	}
	if e2e.One(t, m, "outboxd_server_wal_lsn") < m["outboxd_confirmed_lsn"] {
		t.Errorf("server WAL LSN %v behind confirmed %v", m["outboxd_server_wal_lsn"], m["outboxd_confirmed_lsn"])
	}
	if e2e.One(t, m, `outboxd_slot_polls_total{result="ok"}`) < 2 || m["outboxd_slot_retained_wal_bytes"] <= 0 {
		t.Errorf("slot poller: %v polls, retained %v bytes", m[`outboxd_slot_polls_total{result="ok"}`], m["outboxd_slot_retained_wal_bytes"])
	}
	// The operators' signals: this process is the active one, it streams
	// from a slot whose WAL is kept (reserved, or extended past max_wal_size
	// on a busy server), and it published an event not long ago.
	if v := e2e.One(t, m, `outboxd_state{state="active"}`); v != 1 {
		t.Errorf(`outboxd_state{state="active"} = %v, want 1`, v)
	}
	if v := e2e.One(t, m, "outboxd_slot_active"); v != 1 {
		t.Errorf("outboxd_slot_active = %v, want 1", v)
	}
	if v := e2e.One(t, m, `outboxd_slot_wal_status{status="reserved"}`) + e2e.One(t, m, `outboxd_slot_wal_status{status="extended"}`); v != 1 {
		t.Errorf("outboxd_slot_wal_status reserved + extended = %v, want 1", v)
	}
	if v := e2e.One(t, m, "outboxd_last_event_timestamp_seconds"); v < float64(time.Now().Add(-5*time.Minute).Unix()) || v > float64(time.Now().Unix()+1) {
		t.Errorf("outboxd_last_event_timestamp_seconds = %v, want within the last few minutes", v)
	}
	if code, body := e2e.Get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s", code, body)
	}
	d.Stop()
}

func TestRunReadyzActiveStandbyRestarting(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	// A long first backoff keeps the restarting state visible.
	a, aURL := e.StartWithMetrics("--restart-backoff-min", "4s", "--restart-backoff-max", "4s")
	a.WaitLog("streaming", 60*time.Second)
	waitReady := func(name, url string, code int, body string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, b := e2e.Get(t, url+"/readyz")
			if c == code && strings.Contains(b, body) {
				t.Logf("%s /readyz: %d %s", name, c, strings.TrimSpace(b))
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s /readyz: %d %q, want %d and %q", name, c, b, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitReady("active", aURL, http.StatusOK, "ready: active")

	b, bURL := e.StartWithMetrics("--standby-poll-interval", "300ms")
	b.WaitLog("standby: another process holds the slot", 30*time.Second)
	waitReady("standby", bURL, http.StatusOK, "ready: standby")
	if v := e2e.One(t, e2e.Scrape(t, bURL), "outboxd_standby"); v != 1 {
		t.Errorf("standby's outboxd_standby = %v, want 1", v)
	}

	// Kill the active instance's walsender: its pipeline fails and waits
	// out the backoff, not ready; the standby takes over.
	e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot)
	waitReady("restarting", aURL, http.StatusServiceUnavailable, "not ready: restarting")
	if v := e2e.One(t, e2e.Scrape(t, aURL), `outboxd_pipeline_restarts_total{cause="postgres"}`); v != 1 {
		t.Errorf("restarts by cause postgres = %v, want 1", v)
	}
	waitReady("former standby", bURL, http.StatusOK, "ready: active")
	waitReady("former active", aURL, http.StatusOK, "ready: standby")
	if code, _ := e2e.Get(t, aURL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d", code)
	}
	a.Stop()
	b.Stop()
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	common := []string{"--pg-dsn", e.DSN, "--slot", e.Slot, "--publication", e.Slot}

	code, out := e2e.RunOnce(t, append([]string{"status"}, common...)...)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("replication slot %q does not exist", e.Slot)) {
		t.Fatalf("status before the slot exists: exit %d\n%s", code, out)
	}

	d := e.Start()
	code, out = e2e.RunOnce(t, append([]string{"status"}, common...)...)
	t.Logf("status of a running outboxd:\n%s", out)
	if code != 0 || !strings.Contains(out, "active") || !strings.Contains(out, "yes (pid ") || !strings.Contains(out, "status") {
		t.Fatalf("status while running: exit %d\n%s", code, out)
	}
	code, out = e2e.RunOnce(t, append([]string{"status", "--json"}, common...)...)
	var rep e2e.StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
	}
	if !rep.OK || !rep.Slot.Active || rep.Slot.ActivePID == 0 || rep.Slot.WALStatus != "reserved" ||
		!rep.Publication.Exists || len(rep.Publication.Tables) != 1 || rep.Slot.ConfirmedFlushLSN == "" {
		t.Fatalf("status --json: %+v", rep)
	}
	code, out = e2e.RunOnce(t, append([]string{"status", "--max-retained-wal-bytes", "1"}, common...)...)
	if code != 1 || !strings.Contains(out, "above --max-retained-wal-bytes 1") {
		t.Fatalf("status with a retained-WAL limit of 1 byte: exit %d\n%s", code, out)
	}

	d.Stop()
	code, out = e2e.RunOnce(t, append([]string{"status", "--json"}, common...)...)
	if code != 1 || !strings.Contains(out, "no process streams from replication slot") {
		t.Fatalf("status with outboxd stopped: exit %d\n%s", code, out)
	}
	code, out = e2e.RunOnce(t, append([]string{"status", "--allow-inactive"}, common...)...)
	if code != 0 {
		t.Fatalf("status --allow-inactive with outboxd stopped: exit %d\n%s", code, out)
	}
}

// While Kafka is down the producer keeps sending the same batch (order
// first), so the session does not fail; /readyz must still say that nothing
// moves once events have waited longer than --stall-timeout, and the stalled
// metric must show it. (With the wedge — a full in-flight window that never
// moved again after Kafka came back — this is what a user would have seen:
// 503 and a growing outboxd_stalled_seconds.)
func TestRunNotReadyWhileStalled(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("notready"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, ks.Brokers, e.Topic, 1)
	e.Migrate()
	d, base := e.StartWithMetrics("--stall-timeout", "2s")
	d.WaitLog("streaming", 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = e.Write(ctx, e2e.Load{Writers: 1, Aggregates: 10, Total: 100000, MaxTxn: 5, Pause: 20 * time.Millisecond})
	}()
	topic := fmt.Sprintf(`{topic=%q}`, e.Topic)
	e2e.WaitFor(t, 30*time.Second, func() bool { return e2e.Scrape(t, base)["outboxd_events_published_total"+topic] > 0 })
	if code, body := e2e.Get(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz while publishing: %d %q", code, body)
	}

	ks.Kill()
	killed := time.Now()
	e2e.WaitFor(t, 30*time.Second, func() bool {
		code, body := e2e.Get(t, base+"/readyz")
		if code == http.StatusServiceUnavailable && !strings.Contains(body, "not ready: stalled") {
			t.Fatalf("/readyz while Kafka is down: %q", body)
		}
		return code == http.StatusServiceUnavailable
	})
	t.Logf("not ready %s after Kafka was killed (--stall-timeout 2s)", time.Since(killed).Round(time.Millisecond))
	if took := time.Since(killed); took > 10*time.Second {
		t.Errorf("not ready only %s after Kafka was killed", took)
	}
	m := e2e.Scrape(t, base)
	if v := m["outboxd_stalled_seconds"]; v < 2 {
		t.Errorf("outboxd_stalled_seconds %v while not ready for a stall, want ≥ 2", v)
	}
	t.Logf("Kafka killed: stalled %.1f s, in flight %v, lag %.2f s, retries %v",
		m["outboxd_stalled_seconds"], m["outboxd_in_flight_events"], m["outboxd_lag_seconds"], m["outboxd_produce_retries_total"+topic])
	ks.Start()
	e2e.WaitFor(t, 90*time.Second, func() bool {
		code, body := e2e.Get(t, base+"/readyz")
		return code == http.StatusOK && strings.Contains(body, "ready: active")
	})
	if v := e2e.Scrape(t, base)["outboxd_stalled_seconds"]; v > 1 {
		t.Errorf("outboxd_stalled_seconds %v after Kafka came back", v)
	}
	cancel()
	d.Stop()
}
