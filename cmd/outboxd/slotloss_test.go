package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

// A slot dropped while outboxd was stopped: events written in
// between were never read. outboxd run refuses, naming the gap; outboxd
// replay --since … --resume publishes them from the table, then streams on.
// Every row arrives (some twice: the replay starts at a time, consumers
// dedup by outbox-id), in per-key order.
func TestRunSlotDroppedRefusesThenReplayRecovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	d := e.start()
	ctx := context.Background()
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 500, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.delivered(time.Minute)
	d.stop()
	stoppedAt := time.Now().UTC().Add(-time.Second)
	// While outboxd is stopped: new events, and someone drops the slot.
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 300, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.exec(`SELECT pg_drop_replication_slot($1)`, e.slot)

	refused := startDaemon(t, e.args()...)
	if code := refused.wait(60 * time.Second); code == 0 || !strings.Contains(refused.out.String(), "gap between the checkpoint and the slot") {
		t.Fatalf("run after the slot was dropped: exit %d\n%s\nwant a refusal naming the gap", code, refused.out.String())
	}
	args := e.args("--since", stoppedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := startDaemon(t, args...)
	r.waitLog("rows published again", 60*time.Second)
	r.waitLog("streaming", 60*time.Second)
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 200, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	v, n := e.delivered(2 * time.Minute)
	t.Logf("slot dropped while stopped, replay --since --resume: %d events: %s", n, v)
	if v.lost != 0 || v.reordered != 0 || v.corrupt != 0 {
		t.Fatalf("after replay: %s", v)
	}
	r.stop()
}

// A slot invalidated by max_slot_wal_keep_size while outboxd was stopped
// (PostgreSQL 17 by default, OUTBOXD_TEST_PG_VERSION otherwise): outboxd
// run stops with one clear line instead of a restart loop; dropping the slot
// and replaying recovers every row.
func TestRunInvalidatedSlotRefusesThenReplayRecovers(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresVersion(t, pgTestVersion())
	e, _ := serverEnv(t, srv, 3)
	d := e.start()
	ctx := context.Background()
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 300, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.delivered(time.Minute)
	d.stop()
	stoppedAt := time.Now().UTC().Add(-time.Second)
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 200, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	// Other tables churn WAL past max_slot_wal_keep_size: the slot is lost.
	e.exec(`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
	e.exec(`SELECT pg_reload_conf()`)
	e.exec(`CREATE TABLE churn (x text)`)
	waitFor(t, 2*time.Minute, func() bool {
		e.exec(`INSERT INTO churn SELECT repeat('x', 1000) FROM generate_series(1, 20000)`)
		e.exec(`SELECT pg_switch_wal()`)
		e.exec(`CHECKPOINT`)
		c := e.conn()
		defer c.Close(ctx)
		var status string
		_ = c.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, e.slot).Scan(&status)
		return status == "lost"
	})
	e.exec(`ALTER SYSTEM RESET max_slot_wal_keep_size`)
	e.exec(`SELECT pg_reload_conf()`)

	refused := startDaemon(t, e.args()...)
	if code := refused.wait(60 * time.Second); code == 0 || !strings.Contains(refused.out.String(), "lost WAL it needed") {
		t.Fatalf("run with an invalidated slot: exit %d\n%s\nwant one clear refusal", code, refused.out.String())
	}
	e.exec(`SELECT pg_drop_replication_slot($1)`, e.slot)
	args := e.args("--since", stoppedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := startDaemon(t, args...)
	r.waitLog("rows published again", 60*time.Second)
	r.waitLog("streaming", 60*time.Second)
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 100, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	v, n := e.delivered(2 * time.Minute)
	t.Logf("PostgreSQL %s, slot invalidated while stopped, replay --since --resume: %d events: %s", pgTestVersion(), n, v)
	if v.lost != 0 || v.reordered != 0 || v.corrupt != 0 {
		t.Fatalf("after replay: %s", v)
	}
	r.stop()
}

// Failover on PostgreSQL 15, which has no failover slots: the slot stays on
// the old primary. outboxd reconnects to the promoted standby, finds no slot
// and stops with a clear error instead of creating one past a gap; replay
// --since … --resume against the new primary delivers every row.
func TestRunFailoverWithoutFailoverSlotsThenReplay(t *testing.T) {
	t.Parallel()
	primary := testenv.StartPostgresVersion(t, "15")
	e, _ := serverEnv(t, primary, 3)
	db := strings.TrimPrefix(mustURL(t, e.dsn).Path, "/")
	standby := primary.StartStandby(testenv.UniqueName("standby"))
	e.dsn = fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
		primary.Port, standby.Port, db)
	d := e.start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writers := make(chan error, 2)
	for w := range 2 {
		go func() { writers <- e.resilientWriter(ctx, w, 2, 100) }()
	}
	waitFor(t, time.Minute, func() bool { return endOffsets(e.brokers, e.topic) > 200 })
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
	if code := d.wait(90 * time.Second); code == 0 || !strings.Contains(d.out.String(), "does not exist") {
		t.Fatalf("outboxd after a failover without failover slots: exit %d\n%s\nwant it to stop: the slot is gone", code, d.p.Tail(20))
	}
	args := e.args("--since", failedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := startDaemon(t, args...)
	r.waitLog("rows published again", 90*time.Second)
	r.waitLog("streaming", 60*time.Second)
	time.Sleep(2 * time.Second)
	cancel()
	for range 2 {
		if err := <-writers; err != nil {
			t.Errorf("writer: %v", err)
		}
	}
	e.settle()
	v, n := e.delivered(2 * time.Minute)
	t.Logf("PostgreSQL 15 failover without failover slots, replay --since --resume: %d rows: %s", n, v)
	if v.lost != 0 || v.reordered != 0 || v.corrupt != 0 {
		t.Fatalf("after the failover and replay: %s", v)
	}
	r.stop()
}

// Retention never loses an event under CDC: rows deleted before outboxd
// read them are still published, from the WAL records of their INSERTs.
// And --retention deletes old rows while outboxd streams.
func TestRunRetentionDeletesRowsAndLosesNoEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	d := e.start()
	d.stop()
	e.exec(`INSERT INTO outbox (aggregate_id, topic, payload, created_at)
		SELECT 'agg-' || (g % 10), $1, jsonb_build_object('seq', g), now() - interval '2 hours'
		FROM generate_series(1, 500) AS g ORDER BY g`, e.topic)
	want := e.rows()
	if code, out := runOnce(t, "prune", "--pg-dsn", e.dsn, "--older-than", "1h"); code != 0 || !strings.Contains(out, "deleted 500 outbox rows") {
		t.Fatalf("prune: exit %d\n%s", code, out)
	}
	d = e.start("--retention", "1s", "--retention-interval", "200ms")
	v := verify(t, want, consume(t, e.brokers, e.topic, want, time.Minute))
	t.Logf("500 rows deleted before outboxd read them: %s", v)
	if v.lost != 0 || v.reordered != 0 || v.corrupt != 0 {
		t.Fatalf("rows deleted before they were read: %s", v)
	}
	// New rows age past --retention 1s and go, while they are published.
	e.exec(`INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'agg-1', $1, '{}' FROM generate_series(1, 100)`, e.topic)
	waitFor(t, time.Minute, func() bool { return endOffsets(e.brokers, e.topic) >= 600 })
	waitFor(t, time.Minute, func() bool {
		c := e.conn()
		defer c.Close(context.Background())
		var n int
		return c.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n) == nil && n == 0
	})
	if !strings.Contains(d.out.String(), "retention: deleted old outbox rows") {
		t.Errorf("no retention log line")
	}
	d.stop()
}
