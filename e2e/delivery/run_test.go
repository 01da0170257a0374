package delivery

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

func TestRunPublishesEveryEventOnceInPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 6)
	d := e.Start()
	if err := e.Write(context.Background(), e2e.Load{Writers: 4, Aggregates: 200, Total: 10000, MaxTxn: 500}); err != nil {
		t.Fatal(err)
	}
	v, _ := e.Delivered(2 * time.Minute)
	t.Logf("clean run, 10000 events: %s", v)
	if v != (e2e.Verdict{}) {
		t.Fatalf("clean run: %s, want all zero", v)
	}
	d.Stop()
}

func TestRunCleanStopAndRestartLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	d := e.Start()
	ctx := context.Background()
	writeDone := make(chan error, 1)
	go func() {
		// Big transactions, so the stop likely falls inside one.
		writeDone <- e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 50, Total: 8000, MaxTxn: 300, Pause: 20 * time.Millisecond})
	}()
	time.Sleep(1500 * time.Millisecond)
	d.Stop() // mid-stream
	d = e.Start()
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	v, _ := e.Delivered(2 * time.Minute)
	t.Logf("clean stop and restart mid-stream: %s", v)
	if n := strings.Count(d.Out.String(), "restarting pipeline"); n > 0 {
		t.Logf("the second instance restarted its pipeline %d times (duplicates are then expected)", n)
	}
	if v != (e2e.Verdict{}) {
		t.Fatalf("after a clean restart: %s, want all zero", v)
	}
	d.Stop()
}

func TestRunKill9FiveTimesLosesNothing(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writeDone := make(chan error, 1)
	for i := 0; i < 5; i++ {
		d := e.Start()
		if i == 0 { // the first start creates the slot: rows before it are not in it
			go func() {
				writeDone <- e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 60, Total: 6000, MaxTxn: 30, Pause: 3 * time.Millisecond})
			}()
		}
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		d.Kill9()
	}
	d := e.Start()
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("kill -9 five times mid-stream, %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after kill -9: %s, want nothing lost, reordered or corrupt", v)
	}
	d.Stop()
}

func TestRunSurvivesKafkaOutage(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("outage"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, ks.Brokers, e.Topic, 3)
	e.Migrate()
	d := e.Start()
	ctx := context.Background()
	writeDone := make(chan error, 1)
	go func() {
		// ~40 s of writes: before, during and after the outage.
		writeDone <- e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 40, Total: 3000, MaxTxn: 10, Pause: 70 * time.Millisecond})
	}()
	// Kafka stops once outboxd publishes the load (100 records), not after
	// a fixed 3 s; the 30 s outage is the scenario.
	e.WaitPublishing(100, time.Minute)
	ks.Stop()
	time.Sleep(30 * time.Second)
	if d.Exited() {
		t.Fatalf("outboxd exited (%d) while Kafka was down", d.Code)
	}
	ks.Start()
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("Kafka stopped 30 s under load, %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after a Kafka outage: %s", v)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited (%d)", d.Code)
	}
	// Shorter than --kafka-delivery-timeout: the producer kept sending the
	// same batches, and said so.
	if out := d.Out.String(); !strings.Contains(out, "sending the same batch again") && !strings.Contains(out, "kafka metadata unavailable; retrying") {
		t.Errorf("no produce retry was logged during the outage")
	}
	d.Stop()
}

func TestRunSurvivesPostgresRestart(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPostgres(t)
	k := testenv.Kafka(t)
	e := &e2e.Env{T: t, DSN: ps.DSN, Brokers: k.Brokers, Topic: k.Topic(t, "pgrestart", 3), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	d := e.Start()
	ctx := context.Background()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 40, Total: 3000, MaxTxn: 100}); err != nil {
		t.Fatal(err)
	}
	ps.Restart("fast") // under load: outboxd is still publishing the backlog
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 40, Total: 2000, MaxTxn: 100}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("Postgres fast restart under load, %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after a Postgres restart: %s", v)
	}
	d.Stop()
}

func TestRunIdleOutboxDoesNotPinWAL(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	d := e.Start()
	e.Exec(`CREATE TABLE filler (id bigserial primary key, pad text)`)
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	var start string
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	retained := func() (written, kept int64) {
		err := c.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $2::pg_lsn)::bigint,
			pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
			FROM pg_replication_slots WHERE slot_name = $1`, e.Slot, start).Scan(&written, &kept)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	// Paced at ~2 MB/s: on PostgreSQL < 16 restart_lsn can only move at the
	// running-xacts record the server logs every 15 s, so retained WAL is
	// bounded by that interval's worth of writes, whatever the client does.
	// 128 MB (64 s, four such intervals) is twice the bound: a slot that
	// never moves retains all of it, so the test fails as clearly as with
	// the 256 MB it once wrote, in half the time.
	const chunkRows = 2000 // ~2.5 MB of WAL
	const total = 128 << 20
	var maxKept int64
	began := time.Now()
	for {
		written, kept := retained()
		maxKept = max(maxKept, kept)
		if written >= total {
			break
		}
		if _, err := c.Exec(ctx, `INSERT INTO filler (pad) SELECT repeat('x', 1000) FROM generate_series(1, $1::int)`, chunkRows); err != nil {
			t.Fatal(err)
		}
		if ahead := time.Duration(float64(written)/(2<<20)*float64(time.Second)) - time.Since(began); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	writing := time.Since(began)
	// restart_lsn moves at the server's next running-xacts record (≤ 15 s).
	deadline := time.Now().Add(45 * time.Second)
	var kept int64
	for {
		_, kept = retained()
		if kept < 64<<20 || time.Now().After(deadline) {
			break
		}
		if _, err := c.Exec(ctx, `INSERT INTO filler (pad) VALUES ('tick')`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("idle outbox, %d MB of other WAL in %.0f s: slot retained at most %d kB while writing, %d kB at the end", total>>20, writing.Seconds(), maxKept>>10, kept>>10)
	if maxKept >= 64<<20 || kept >= 64<<20 {
		t.Fatalf("slot retained up to %d MB of WAL with an idle outbox (%d MB at the end), want < 64 MB", maxKept>>20, kept>>20)
	}
	d.Stop()
}

func TestRunStandbyTakesOverWhenActiveIsKilled(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	a := e.Start()
	// An hour between the standby's tries: it takes over because it sees
	// the slot released (slot.AwaitRelease), not because a poll came round.
	b := e2e.StartDaemon(t, append(e.Args(), "--standby-poll-interval", "1h")...)
	b.WaitLog("standby: another process holds the slot", 30*time.Second)
	ctx := context.Background()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 1000, MaxTxn: 10}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	a.Kill9()
	b.WaitLog("taking over: the slot is free", 15*time.Second) // (not "streaming": the standby's log has it already)
	took := time.Since(killed)
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 1000, MaxTxn: 10}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("standby took over %.1f s after the active instance was killed; %d events: %s", took.Seconds(), n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after takeover: %s", v)
	}
	if n := strings.Count(b.Out.String(), "standby: another process holds the slot"); n != 1 {
		t.Errorf("standby logged %d times, want once", n)
	}
	b.Stop()
}

func TestRunPublishesOneHugeTransaction(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 6)
	d := e.Start()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
		SELECT 'agg-' || (g % 1000), $1, jsonb_build_object('n', g, 'pad', repeat('y', 100))
		FROM generate_series(1, 200000) g`, e.Topic)
	v, _ := e.Delivered(4 * time.Minute)
	rss := d.PeakRSS()
	t.Logf("one transaction of 200000 rows: %s; outboxd peak RSS %d MiB", v, rss>>20)
	if v != (e2e.Verdict{}) {
		t.Fatalf("huge transaction: %s", v)
	}
	d.Stop()
}

func TestRunKeepsStatusUpdatesFlowingWhileBackpressured(t *testing.T) {
	t.Parallel()
	ps := testenv.StartPostgres(t)
	k := testenv.Kafka(t)
	e := &e2e.Env{T: t, DSN: ps.DSN, Brokers: k.Brokers, Topic: k.Topic(t, "backpressure", 1), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	e.Exec(`ALTER SYSTEM SET wal_sender_timeout = '2s'`)
	e.Exec(`SELECT pg_reload_conf()`)
	// Kafka acknowledges a batch only every 3 s and at most 500 events may be
	// in flight: the stream sits blocked on a full pipeline for ~12 s, far
	// longer than wal_sender_timeout.
	d := e.Start("--kafka-linger", "3s", "--max-in-flight-events", "500", "--status-interval", "500ms")
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
		SELECT 'agg-' || (g % 10), $1, jsonb_build_object('n', g) FROM generate_series(1, 2000) g`, e.Topic)
	v, _ := e.Delivered(2 * time.Minute)
	pglog, _ := os.ReadFile(filepath.Join(ps.Dir, "postgres.log"))
	t.Logf("backpressured 2000 events behind a 3 s linger: %s", v)
	if v != (e2e.Verdict{}) {
		t.Fatalf("backpressured run: %s", v)
	}
	if strings.Contains(string(pglog), "replication timeout") {
		t.Fatalf("the server timed out the walsender while outboxd was backpressured")
	}
	if strings.Contains(d.Out.String(), "restarting pipeline") {
		t.Fatalf("the pipeline restarted while backpressured")
	}
	d.Stop()
}

func TestRunStopInsideATransactionFinishesItFirst(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	// Slow acknowledgements and a small in-flight bound: the 2000-row
	// transaction takes ~4 s to publish, so SIGTERM arrives inside it.
	d := e.Start("--kafka-linger", "200ms", "--max-in-flight-events", "100")
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
		SELECT 'agg-' || (g % 10), $1, jsonb_build_object('n', g) FROM generate_series(1, 2000) g`, e.Topic)
	time.Sleep(time.Second)
	d.Stop()
	d = e.Start()
	v, _ := e.Delivered(time.Minute)
	t.Logf("SIGTERM inside a 2000-row transaction: %s", v)
	if v != (e2e.Verdict{}) {
		t.Fatalf("stop inside a transaction: %s, want all zero (the transaction is finished, then confirmed)", v)
	}
	d.Stop()
}
