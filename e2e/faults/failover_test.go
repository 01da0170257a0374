package faults

// outboxd on other PostgreSQL majors than the dev stack's (Debian's 15):
// private servers from Maven Central's builds (testenv.StartPostgresVersion).
// make test runs them on 17; make test-pg14 / test-pg16 set
// OUTBOXD_TEST_PG_VERSION to run the same tests on 14 or 16.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// statusJSON runs outboxd status --json on the env's slot.
func statusJSON(e *e2e.Env) e2e.StatusReport {
	e.T.Helper()
	code, out := testproc.Run(e.T, 30*time.Second, e2e.BinPath, "status", "--json", "--allow-inactive",
		"--pg-dsn", e.DSN, "--slot", e.Slot, "--publication", e.Slot)
	var rep e2e.StatusReport
	i, j := strings.Index(out, "{"), strings.LastIndex(out, "}")
	if i < 0 || j < i {
		e.T.Fatalf("outboxd status --json exited %d without a report:\n%s", code, out)
	}
	if err := json.Unmarshal([]byte(out[i:j+1]), &rep); err != nil {
		e.T.Fatalf("outboxd status --json exited %d: %v\n%s", code, err, out)
	}
	return rep
}

// serverVersionNum is server_version_num of the env's server.
func serverVersionNum(e *e2e.Env) int {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var v int
	if err := c.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		e.T.Fatal(err)
	}
	return v
}

// TestRunOnPostgresVersion runs outboxd on a private PostgreSQL of
// pgTestVersion: a burst of multi-row transactions, then steady single-row
// ones, everything delivered once in per-key order; on 17 the slot outboxd
// creates is a failover slot. Before 15, it also floods outboxd with empty
// transactions (pgoutput sends Begin/Commit for every transaction there).
func TestRunOnPostgresVersion(t *testing.T) {
	t.Parallel()
	version := e2e.PGTestVersion()
	srv := testenv.StartPostgresVersion(t, version)

	t.Run("load", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		e, _ := e2e.ServerEnv(t, srv, 3)
		d := e.Start()
		// The burst first, then the steady load: each key has one writer at
		// a time, so per key, id order is commit order.
		if err := e.Write(context.Background(), e2e.Load{Writers: 4, Aggregates: 200, Total: 20_000, MaxTxn: 100}); err != nil {
			t.Fatalf("burst: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
		defer cancel()
		steady := e.Steady(ctx, 300)
		<-ctx.Done()
		if err := <-steady; err != nil {
			t.Fatalf("steady load: %v", err)
		}
		v, n := e.Delivered(60 * time.Second)

		if serverVersionNum(e) >= 170000 {
			if failover := statusJSON(e).Slot.Failover; failover == nil || !*failover {
				t.Errorf("on PostgreSQL %s, outboxd status shows failover %v, want true", version, failover)
			}
		}
		d.Stop()
		t.Logf("PostgreSQL %s: %d rows, %s, in %s", version, n, v, time.Since(began).Round(time.Millisecond))
		if v != (e2e.Verdict{}) {
			t.Fatalf("delivery: %s", v)
		}
	})

	t.Run("empty transactions", func(t *testing.T) {
		t.Parallel()
		e, k := e2e.ServerEnv(t, srv, 1)
		if serverVersionNum(e) >= 150000 {
			t.Skipf("PostgreSQL %s: pgoutput sends no empty transactions (from 15 on); run make test-pg14", version)
		}
		emptyTransactionFlood(t, e, k)
	})
}

// emptyTransactionFlood: thousands of empty transactions per second (each a
// Begin/Commit pair on 14) while events flow; then one event's ack is held
// for holdFor by a slow post-publish hook while the flood goes on. outboxd
// must deliver everything and confirm past the flood afterwards; the growth of
// its peak RSS during the hold is logged.
func emptyTransactionFlood(t *testing.T, e *e2e.Env, k *testenv.KafkaEnv) {
	const (
		rate    = 5000 // empty transactions per second, aimed at
		phase   = 10 * time.Second
		holdFor = 15 * time.Second
	)
	slow := k.Topic(t, "slow", 1)
	e.Exec(`CREATE TABLE noise (n int)`)
	d := e.Start("--hook", fmt.Sprintf("%s=SELECT pg_sleep(%d)", slow, int(holdFor.Seconds())))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	steady := e.Steady(ctx, 100)
	flood := make(chan int, 1)
	go func() { flood <- emptyTransactions(e, ctx, rate) }()

	time.Sleep(phase)
	base := d.PeakRSS()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('slow', $1, '{}')`, slow)
	time.Sleep(holdFor + 2*time.Second)
	held := d.PeakRSS()
	cancel()
	// The held event went to its own topic; the rest is checked on e.Topic.
	if got := e2e.EndOffsets(e.Brokers, slow); got != 1 {
		t.Errorf("the held event: %d records on its topic, want 1", got)
	}
	e.Exec(`DELETE FROM outbox WHERE topic = $1`, slow)
	empty := <-flood
	if err := <-steady; err != nil {
		t.Fatalf("steady load: %v", err)
	}
	v, n := e.Delivered(60 * time.Second)

	// Afterwards the slot is confirmed past the flood: the last empty
	// transactions too (outboxd confirms the server's WAL end when idle).
	c := e.Conn()
	defer c.Close(context.Background())
	var lag int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := c.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() - confirmed_flush_lsn
			FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&lag); err != nil {
			t.Fatal(err)
		}
		if lag < 64<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited: %s", d.P.Tail(30))
	}
	d.Stop()
	growth := held - base
	t.Logf("%d empty transactions in %s (%.0f/s), %d events: %s; peak RSS %d MiB before the held ack, +%d MiB after %s held; slot lag afterwards %d bytes",
		empty, phase+holdFor+2*time.Second, float64(empty)/(phase+holdFor+2*time.Second).Seconds(), n, v, base>>20, growth>>20, holdFor, lag)
	if v != (e2e.Verdict{}) {
		t.Errorf("delivery: %s", v)
	}
	if lag >= 64<<10 {
		t.Errorf("slot lag %d bytes 20 s after the load: the empty transactions were not confirmed", lag)
	}
	// Peak RSS is logged, not asserted: it is too coarse for the ~57 bytes
	// each empty transaction queued behind a held ack costs (publisher's
	// Watermark keeps one entry per transaction until the oldest is acked:
	// +4 MiB in one run, +17 MiB in another, for 75k of them).
}

// emptyTransactions commits about rate transactions per second that touch
// only table noise (no published table) until ctx ends, and returns how many.
// Each DO block commits 100 of them in one round trip.
func emptyTransactions(e *e2e.Env, ctx context.Context, rate int) int {
	c, err := pgx.Connect(context.Background(), e.DSN)
	if err != nil {
		e.T.Error(err)
		return 0
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		e.T.Error(err)
		return 0
	}
	const batch = 100
	every := time.Second * batch / time.Duration(rate)
	next := time.Now()
	n := 0
	for ctx.Err() == nil {
		if _, err := c.Exec(ctx, `DO $$ BEGIN FOR i IN 1..`+strconv.Itoa(batch)+` LOOP
			INSERT INTO noise VALUES (i); COMMIT; END LOOP; END $$`); err != nil {
			if ctx.Err() == nil {
				e.T.Errorf("empty transactions: %v", err)
			}
			break
		}
		n += batch
		next = next.Add(every)
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		} else if d < -time.Second {
			next = time.Now() // behind: do not burst to catch up
		}
	}
	return n
}

// TestFailoverSlotTakeover: PostgreSQL 17 with a physical standby that syncs
// outboxd's failover slot. outboxd connects with a multi-host DSN
// (target_session_attrs=read-write) and publishes 300 events/s; once the
// standby's copy of the slot is ready, the primary stops and the standby is
// promoted. outboxd must carry on from the synced slot on the new primary
// without exiting: nothing lost, per-key order kept.
func TestFailoverSlotTakeover(t *testing.T) {
	t.Parallel()
	version := e2e.PGTestVersion()
	if major, _ := strconv.Atoi(strings.SplitN(version, ".", 2)[0]); major < 17 {
		t.Skipf("PostgreSQL %s has no failover slots (17+)", version)
	}
	primary := testenv.StartPostgresVersion(t, version)
	e, _ := e2e.ServerEnv(t, primary, 3)
	db := strings.TrimPrefix(e2e.MustURL(t, e.DSN).Path, "/")
	standby := primary.StartStandby(testenv.UniqueName("standby"))
	e.DSN = fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
		primary.Port, standby.Port, db)
	d := e.Start()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writers := make(chan error, 3)
	for w := range 3 {
		go func() { writers <- e.ResilientWriter(ctx, w, 3, 100) }()
	}

	// The standby's copy of the slot is ready for a failover.
	sc, err := pgx.Connect(context.Background(), standby.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(context.Background())
	began := time.Now()
	for {
		var ready bool
		err := sc.QueryRow(context.Background(), `SELECT coalesce(bool_or(synced AND NOT temporary AND invalidation_reason IS NULL), false)
			FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&ready)
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			break
		}
		if time.Since(began) > 90*time.Second {
			t.Fatalf("the standby's copy of slot %s is not ready after 90 s", e.Slot)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("slot synced on the standby after %s", time.Since(began).Round(time.Millisecond))
	time.Sleep(3 * time.Second)

	stopped := time.Now()
	primary.Stop("fast")
	if _, err := sc.Exec(context.Background(), `SELECT pg_promote()`); err != nil {
		t.Fatalf("promote: %v", err)
	}
	promoted := time.Now()
	base := e2e.EndOffsets(e.Brokers, e.Topic)
	var takeover time.Duration
	for {
		if n := e2e.EndOffsets(e.Brokers, e.Topic); n > base && base >= 0 {
			takeover = time.Since(stopped)
			break
		}
		if d.Exited() {
			t.Fatalf("outboxd exited after the failover: %s", d.P.Tail(30))
		}
		if time.Since(promoted) > 60*time.Second {
			t.Fatalf("outboxd published nothing within 60 s of the promotion: %s", d.P.Tail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The new primary's load through the new stream (1,500 records: the
	// 5 s the test used to sleep, at 300 events/s) before the writers stop.
	e.WaitPublishing(1500, 2*time.Minute)
	cancel()
	for range 3 {
		if err := <-writers; err != nil {
			t.Errorf("writer: %v", err)
		}
	}
	e.Settle()
	v, n := e.Delivered(60 * time.Second)
	if d.Exited() {
		t.Fatalf("outboxd exited: %s", d.P.Tail(30))
	}
	d.Stop()
	t.Logf("PostgreSQL %s failover: %d rows, %s; primary stopped → standby promoted in %s, publishing again %s after the stop; restarts %v",
		version, n, v, promoted.Sub(stopped).Round(time.Millisecond), takeover.Round(time.Millisecond), d.Restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("delivery across the failover: %s", v)
	}
}
