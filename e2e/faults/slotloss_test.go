package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// A slot dropped while outboxd was stopped: events written in
// between were never read. outboxd run refuses, naming the gap; outboxd
// replay --since … --resume publishes them from the table, then streams on.
// Every row arrives (some twice: the replay starts at a time, consumers
// dedup by outbox-id), in per-key order.
func TestRunSlotDroppedRefusesThenReplayRecovers(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	d := e.Start()
	ctx := context.Background()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 500, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.Delivered(time.Minute)
	d.Stop()
	stoppedAt := time.Now().UTC().Add(-time.Second)
	// While outboxd is stopped: new events, and someone drops the slot.
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 300, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.Exec(`SELECT pg_drop_replication_slot($1)`, e.Slot)

	refused := e2e.StartDaemon(t, e.Args()...)
	if code := refused.Wait(60 * time.Second); code == 0 || !strings.Contains(refused.Out.String(), "gap between the checkpoint and the slot") {
		t.Fatalf("run after the slot was dropped: exit %d\n%s\nwant a refusal naming the gap", code, refused.Out.String())
	}
	args := e.Args("--since", stoppedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := e2e.StartDaemon(t, args...)
	r.WaitLog("rows published again", 60*time.Second)
	r.WaitLog("streaming", 60*time.Second)
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 200, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("slot dropped while stopped, replay --since --resume: %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after replay: %s", v)
	}
	r.Stop()
}

// A slot invalidated by max_slot_wal_keep_size while outboxd was stopped
// (PostgreSQL 17 by default, OUTBOXD_TEST_PG_VERSION otherwise): outboxd
// run stops with one clear line instead of a restart loop; dropping the slot
// and replaying recovers every row.
func TestRunInvalidatedSlotRefusesThenReplayRecovers(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresVersion(t, e2e.PGTestVersion())
	e, _ := e2e.ServerEnv(t, srv, 3)
	d := e.Start()
	ctx := context.Background()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 300, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.Delivered(time.Minute)
	d.Stop()
	stoppedAt := time.Now().UTC().Add(-time.Second)
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 200, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	// Other tables churn WAL past max_slot_wal_keep_size: the slot is lost.
	e.Exec(`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	e.Exec(`SELECT pg_reload_conf()`)
	e.Exec(`CREATE TABLE churn (x text)`)
	e2e.WaitFor(t, 2*time.Minute, func() bool {
		e.Exec(`INSERT INTO churn SELECT repeat('x', 1000) FROM generate_series(1, 20000)`)
		e.Exec(`SELECT pg_switch_wal()`)
		e.Exec(`CHECKPOINT`)
		c := e.Conn()
		defer c.Close(ctx)
		var status string
		_ = c.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&status)
		return status == "lost"
	})
	e.Exec(`ALTER SYSTEM RESET max_slot_wal_keep_size`)
	e.Exec(`SELECT pg_reload_conf()`)

	refused := e2e.StartDaemon(t, e.Args()...)
	if code := refused.Wait(60 * time.Second); code == 0 || !strings.Contains(refused.Out.String(), "lost WAL it needed") {
		t.Fatalf("run with an invalidated slot: exit %d\n%s\nwant one clear refusal", code, refused.Out.String())
	}
	e.Exec(`SELECT pg_drop_replication_slot($1)`, e.Slot)
	args := e.Args("--since", stoppedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := e2e.StartDaemon(t, args...)
	r.WaitLog("rows published again", 60*time.Second)
	r.WaitLog("streaming", 60*time.Second)
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 100, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("PostgreSQL %s, slot invalidated while stopped, replay --since --resume: %d events: %s", e2e.PGTestVersion(), n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after replay: %s", v)
	}
	r.Stop()
}

// Failover on PostgreSQL 15, which has no failover slots: the slot stays on
// the old primary. outboxd reconnects to the promoted standby, finds no slot
// and stops with a clear error instead of creating one past a gap; replay
// --since … --resume against the new primary delivers every row.
func TestRunFailoverWithoutFailoverSlotsThenReplay(t *testing.T) {
	t.Parallel()
	primary := testenv.StartPostgresVersion(t, "15")
	e, _ := e2e.ServerEnv(t, primary, 3)
	db := strings.TrimPrefix(e2e.MustURL(t, e.DSN).Path, "/")
	standby := primary.StartStandby(testenv.UniqueName("standby"))
	e.DSN = fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
		primary.Port, standby.Port, db)
	d := e.Start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writers := make(chan error, 2)
	for w := range 2 {
		go func() { writers <- e.ResilientWriter(ctx, w, 2, 100) }()
	}
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 200 })
	failedAt := time.Now().UTC().Add(-10 * time.Second)
	primary.Stop("fast")
	sc, err := pgx.Connect(context.Background(), standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(context.Background())
	if _, err := sc.Exec(context.Background(), `SELECT pg_promote()`); err != nil {
		t.Fatalf("promote: %v", err)
	}
	if code := d.Wait(90 * time.Second); code == 0 || !strings.Contains(d.Out.String(), "does not exist") {
		t.Fatalf("outboxd after a failover without failover slots: exit %d\n%s\nwant it to stop: the slot is gone", code, d.P.Tail(20))
	}
	args := e.Args("--since", failedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := e2e.StartDaemon(t, args...)
	r.WaitLog("rows published again", 90*time.Second)
	r.WaitLog("streaming", 60*time.Second)
	// The resumed stream publishes the writers' new rows (200 more records,
	// about a second of them) before they stop.
	e.WaitPublishing(200, time.Minute)
	cancel()
	for range 2 {
		if err := <-writers; err != nil {
			t.Errorf("writer: %v", err)
		}
	}
	e.Settle()
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("PostgreSQL 15 failover without failover slots, replay --since --resume: %d rows: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after the failover and replay: %s", v)
	}
	r.Stop()
}

// Retention never loses an event under CDC: rows deleted before outboxd
// read them are still published, from the WAL records of their INSERTs.
// And --retention deletes old rows while outboxd streams.
func TestRunRetentionDeletesRowsAndLosesNoEvent(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	d := e.Start()
	d.Stop()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, created_at)
		SELECT 'agg-' || (g % 10), $1, jsonb_build_object('seq', g), now() - interval '2 hours'
		FROM generate_series(1, 500) AS g ORDER BY g`, e.Topic)
	want := e.Rows()
	if code, out := e2e.RunOnce(t, "prune", "--pg-dsn", e.DSN, "--older-than", "1h"); code != 0 || !strings.Contains(out, "deleted 500 outbox rows") {
		t.Fatalf("prune: exit %d\n%s", code, out)
	}
	d = e.Start("--retention", "1s", "--retention-interval", "200ms")
	v := e2e.Verify(t, want, e2e.Consume(t, e.Brokers, e.Topic, want, time.Minute))
	t.Logf("500 rows deleted before outboxd read them: %s", v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("rows deleted before they were read: %s", v)
	}
	// New rows age past --retention 1s and go, while they are published.
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'agg-1', $1, '{}' FROM generate_series(1, 100)`, e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) >= 600 })
	e2e.WaitFor(t, time.Minute, func() bool {
		c := e.Conn()
		defer c.Close(context.Background())
		var n int
		return c.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
	// The server commits the DELETE before outboxd reads its result and
	// logs it: the line follows the empty table, it may not precede it.
	d.WaitLog("retention: deleted old outbox rows", 30*time.Second)
	d.Stop()
}
