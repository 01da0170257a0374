package faults

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Faults under a running outboxd: Kafka stopped, the walsender frozen. The
// helpers they share with e2e/cluster (end offsets, probe, steady load) are
// in internal/e2e.

// The wedge: a backlog fills the in-flight window, Kafka stops
// for 20 s mid-drain. Before the fix, outboxd published nothing more after
// Kafka came back, without a word. Now the producer retries in place and,
// past --kafka-delivery-timeout, the session restarts from the confirmed
// position; everything arrives in per-key order and the process never exits.
func TestRunBacklogSurvivesKafkaStoppedMidDrain(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("wedge"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, ks.Brokers, e.Topic, 6)
	e.Migrate()
	// The slot must exist before the backlog is written, or it starts after it.
	d := e.Start("--kafka-delivery-timeout", "5s")
	d.Stop()
	const rows = 200_000
	e.Backlog(rows)
	d = e2e.StartDaemon(t, e.Args("--kafka-delivery-timeout", "5s")...)
	e2e.WaitFor(t, 3*time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) >= 40_000 })
	ks.Stop()
	stopped := time.Now()
	for time.Since(stopped) < 20*time.Second {
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) while Kafka was down", d.Code)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ks.Start()
	v, n := e.Delivered(5 * time.Minute)
	r := d.Restarts()
	t.Logf("%d-row backlog, Kafka stopped 20 s mid-drain: %s; restarts %v", n, v, r)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != rows {
		t.Fatalf("after Kafka stopped mid-drain: %s (%d rows)", v, n)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited (%d)", d.Code)
	}
	if r["kafka"] == 0 {
		t.Errorf("no restart with cause kafka was logged: the 20 s outage outlasted --kafka-delivery-timeout 5s")
	}
	d.Stop()
}

// A silent server: the walsender is frozen (SIGSTOP) — the TCP
// connection stays open but nothing comes, not even the keepalive outboxd
// asks for. The watchdog restarts the session after --server-timeout
// (cause postgres); once the walsender is gone the new session streams and
// nothing is lost.
func TestRunRestartsWhenTheWalsenderFreezes(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	d := e.Start("--server-timeout", "4s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 300)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 300 })
	var pid int
	c := e.Conn()
	if err := c.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	frozen := time.Now()
	d.WaitLog("replication server silent", 30*time.Second)
	t.Logf("watchdog fired %s after the walsender froze (--server-timeout 4s)", time.Since(frozen).Round(100*time.Millisecond))
	// The frozen walsender still holds the slot: terminate it, as the server
	// would once wal_sender_timeout passed, and let it go.
	e.Exec(`SELECT pg_terminate_backend($1)`, pid)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	e2e.WaitFor(t, time.Minute, func() bool { return strings.Count(d.Out.String(), "streaming") >= 2 })
	// The new session publishes under the load (300 more records, about a
	// second of it) before the writers stop.
	e.WaitPublishing(300, time.Minute)
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("walsender frozen under 300 ev/s, %d events: %s; restarts %v", n, v, d.Restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after a frozen walsender: %s", v)
	}
	if d.Restarts()["postgres"] == 0 {
		t.Errorf("no restart with cause postgres")
	}
	d.Stop()
}
