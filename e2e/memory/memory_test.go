package memory

// outboxd's memory is bounded by --max-in-flight-bytes, whatever
// the events' size and however long Kafka is away. These tests run an
// outboxd built without the race detector (whose shadow memory would hide
// what is measured) and read its peak RSS (VmHWM) from /proc.

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// memBound is the bound of README "Memory" for a non-race outboxd run at
// budget bytes: Go's soft memory limit that run sets (2 × budget + 24 MiB,
// read from what d logged it set: the formula is run's), which everything
// Go allocates stays within because what is
// live stays well below it (the budget's records, at most half a budget of
// produce requests being encoded, ~15 MiB besides), plus the executable's
// own pages in memory: file-backed, outside Go's limit, and at most the
// executable's size (36 MiB; 22–24 MiB of it measured resident). Each part
// is a bound on what the process holds, not a margin added for luck; what
// the executable's resident pages leave of its size is what covers the
// soft limit's overshoot while a collection catches up with allocation
// (~1 MiB measured). With today's 36 MiB executable that is 2 × budget +
// 60 MiB, within README's 2 × budget + 64 MiB.
func memBound(t testing.TB, d *e2e.Daemon) int64 {
	fi, err := os.Stat(noRaceBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	return memLimit(t, d) + fi.Size()
}

var memLimitLog = regexp.MustCompile(`soft memory limit set from --max-in-flight-bytes[^\n]*"limit_bytes": ([0-9]+)`)

// memLimit is the soft memory limit d logged it set from its budget.
func memLimit(t testing.TB, d *e2e.Daemon) int64 {
	t.Helper()
	m := memLimitLog.FindStringSubmatch(d.Out.String())
	if m == nil {
		t.Fatalf("outboxd logged no memory limit set from --max-in-flight-bytes:\n%s", d.P.Tail(30))
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// residentFile is the executable's pages in the process's memory now
// (RssFile), for the log; -1 if unknown.
func residentFile(d *e2e.Daemon) int64 {
	n, err := testproc.ResidentFile(d.PID())
	if err != nil {
		return -1
	}
	return n
}

var noRace struct {
	once sync.Once
	path string
	err  error
}

// noRaceBinary builds outboxd without the race detector, once per run.
func noRaceBinary(t testing.TB) string {
	t.Helper()
	noRace.once.Do(func() {
		dir, err := os.MkdirTemp("", "outboxd-norace-")
		if err != nil {
			noRace.err = err
			return
		}
		bins, err := testproc.BuildNoRace(dir, "./cmd/outboxd")
		noRace.path, noRace.err = bins["outboxd"], err
	})
	if noRace.err != nil {
		t.Fatalf("build outboxd without -race: %v", noRace.err)
	}
	return noRace.path
}

// startNoRace starts a non-race outboxd with e's arguments and waits until
// it streams.
func startNoRace(e *e2e.Env, extra ...string) *e2e.Daemon {
	e.T.Helper()
	p := testproc.Start(e.T, noRaceBinary(e.T), e.Args(extra...)...)
	d := e2e.NewDaemon(e.T, p)
	d.WaitLog("streaming", 60*time.Second)
	return d
}

// bigRows commits n outbox rows of about size bytes each, in transactions of
// perTxn rows, over aggs aggregates.
func bigRows(e *e2e.Env, n, size, perTxn, aggs int) {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	for done := 0; done < n; done += perTxn {
		_, err := c.Exec(context.Background(), `INSERT INTO outbox (aggregate_id, topic, payload)
			SELECT 'agg-' || (g % $4), $1, jsonb_build_object('n', g, 'pad', repeat(md5(g::text), $5 / 32))
			FROM generate_series($2::int, $3::int) AS g ORDER BY g`,
			e.Topic, done, min(done+perTxn, n)-1, aggs, size)
		if err != nil {
			e.T.Fatal(err)
		}
	}
}

// Kafka stopped while 1,000 events of ~900 KB are committed: outboxd reads
// until the budget is spent and waits; its peak RSS stays within the
// documented bound; once Kafka is back every event arrives, in per-key
// order. Before the byte budget the stream→pipeline channel alone held
// 1,024 decoded events whatever their size (1,948 MiB measured at the
// default budget).
func TestRunMemoryBoundedWhileKafkaIsAway(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("mem"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, ks.Brokers, e.Topic, 6)
	e.Migrate()
	const budget = 16 << 20
	args := []string{"--max-in-flight-bytes", strconv.Itoa(budget)}
	d := startNoRace(e, args...)
	// One event through first: the session then has its producer, and the
	// outage hits a running pipeline (not a start that cannot connect).
	bigRows(e, 1, 100, 1, 1)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) >= 1 })
	ks.Stop()
	const rows, size = 1000, 900_000
	bigRows(e, rows, size, 10, 50)
	down := time.Now()
	for time.Since(down) < 15*time.Second { // the outage, observed
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) while Kafka was down:\n%s", d.Code, d.P.Tail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	during := d.PeakRSS()
	if m := regexp.MustCompile(`[^\n]*restarting pipeline[^\n]*`).FindString(d.Out.String()); m != "" {
		t.Logf("first restart: %s", m)
	}
	ks.Start()
	v, n := e.Delivered(4 * time.Minute)
	peak := d.PeakRSS()
	bound := memBound(t, d)
	t.Logf("%d events of %d KB, Kafka stopped %s, budget %d MiB: peak RSS %d MiB during the outage, %d MiB in all (bound %d MiB: 2 × budget + 24 MiB + the %d MiB executable, of which %d MiB resident; README's 2 × budget + 64 MiB = %d MiB); %s; restarts %v",
		n, size/1000, time.Since(down).Round(time.Second), budget>>20, during>>20, peak>>20, bound>>20, (bound-memLimit(t, d))>>20, residentFile(d)>>20, (2*budget+64<<20)>>20, v, d.Restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != rows+1 {
		t.Fatalf("after Kafka came back: %s (%d rows)", v, n)
	}
	if peak > bound {
		t.Errorf("peak RSS %d MiB > 2 × budget + 24 MiB + the executable's size = %d MiB", peak>>20, bound>>20)
	}
	d.Stop()
}

// Large transactions publish within the same bound, in both delivery
// modes: 200 events of ~900 KB in one transaction (make test), and with
// OUTBOXD_BENCH_MEMORY=1 (make bench-memory) one of 1,000,000 small rows.
// pgoutput sends a transaction at its commit: the stream reads it as fast
// as the budget lets it, and in exactly-once mode the whole transaction is
// one Kafka transaction whose records free their room as they are acked.
func TestRunMemoryBoundedLargeTransactions(t *testing.T) {
	t.Parallel()
	type shape struct {
		name                     string
		rows, size, aggs, perTxn int
	}
	// 20x10x900KB: many transactions, each bigger than the budget's share,
	// so that the next one waits in the hand-off while an exactly-once
	// commit drains.
	shapes := []shape{{"200x900KB", 200, 900_000, 20, 200}, {"20x10x900KB", 200, 900_000, 20, 10}}
	if os.Getenv("OUTBOXD_BENCH_MEMORY") != "" {
		shapes = append(shapes, shape{"1Mx100B", 1_000_000, 100, 1000, 1_000_000})
	}
	for _, s := range shapes {
		for _, mode := range []string{"at-least-once", "exactly-once"} {
			t.Run(s.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				e := e2e.NewEnv(t, 6)
				const budget = 16 << 20
				args := []string{"--max-in-flight-bytes", strconv.Itoa(budget)}
				if mode == "exactly-once" {
					args = e2e.EOSArgs(args...)
				}
				d := startNoRace(e, args...)
				start := time.Now()
				bigRows(e, s.rows, s.size, s.perTxn, s.aggs)
				e2e.WaitFor(t, 10*time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) >= int64(s.rows) })
				took := time.Since(start)
				// The end offsets are only a first signal: in exactly-once
				// mode they count transaction markers and the records of a
				// transaction not yet committed, so they can reach the row
				// count while the last transaction is still open (a CI run
				// stopped outboxd there and read 190 of 200). What a
				// read_committed consumer sees is read before the stop.
				var v e2e.Verdict
				n := s.rows
				if s.size > 1000 {
					v, n = e.Delivered(3 * time.Minute)
				}
				peak := d.PeakRSS()
				bound := memBound(t, d)
				file := residentFile(d)
				d.Stop()
				t.Logf("transactions of %d of %d events of %d B, %s, budget %d MiB: published in %s, peak RSS %d MiB (bound %d MiB; the executable's resident pages %d MiB); %s",
					s.perTxn, n, s.size, mode, budget>>20, took.Round(100*time.Millisecond), peak>>20, bound>>20, file>>20, v)
				if v.Lost != 0 || v.Duplicated != 0 && mode == "exactly-once" || v.Reordered != 0 || v.Corrupt != 0 || n != s.rows {
					t.Fatalf("large transaction: %s (%d rows)", v, n)
				}
				if peak > bound {
					t.Errorf("peak RSS %d MiB > bound %d MiB", peak>>20, bound>>20)
				}
			})
		}
	}
}

// A role that may execute pg_logical_emit_message (PUBLIC, on managed
// servers) emits a 200 MB message with another prefix between outbox rows,
// in one of their transactions and in one of its own: outboxd publishes
// every row, stays within the memory bound of a 16 MiB budget, and counts
// the message with its size. Before the replication stream's frame filter
// pgconn read each message whole: 900 MB took outboxd to 928 MiB RSS, and
// in a container smaller than that it was killed and restarted at the
// same position for good.
func TestRunForeignMessageDoesNotSizeMemory(t *testing.T) {
	t.Parallel()
	const size = 200_000_000
	e := e2e.NewEnv(t, 1)
	const budget = 16 << 20
	d := startNoRace(e, "--max-in-flight-bytes", strconv.Itoa(budget), "--metrics-addr", "127.0.0.1:0")
	m := e2e.MetricsAddrLog.FindStringSubmatch(d.Out.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", d.Out.String())
	}
	base := "http://" + m[1]
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	insert := `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, jsonb_build_object('n', $2::int))`
	if _, err := c.Exec(ctx, insert, e.Topic, 1); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insert, e.Topic, 2); err != nil {
			return err
		}
		// repeat() runs in the server: the test process holds none of it.
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'stranger', repeat('x', $1))`, size); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, e.Topic, 3)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `SELECT pg_logical_emit_message(false, 'stranger', repeat('y', $1))`, size); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, insert, e.Topic, 4); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	peak := d.PeakRSS()
	bound := memBound(t, d)
	got := e2e.Scrape(t, base)
	t.Logf("2 foreign messages of %d MB between %d rows, budget %d MiB: peak RSS %d MiB (bound %d MiB); %s; foreign messages %v, bytes %v",
		size/1_000_000, n, budget>>20, peak>>20, bound>>20, v, got["outboxd_foreign_messages_total"], got["outboxd_foreign_message_bytes_total"])
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != 4 {
		t.Fatalf("rows around the foreign messages: %s (%d rows)", v, n)
	}
	if peak > bound {
		t.Errorf("peak RSS %d MiB > 2 × budget + 24 MiB + the executable = %d MiB: a foreign message's content was held", peak>>20, bound>>20)
	}
	if got["outboxd_foreign_messages_total"] != 2 || got["outboxd_foreign_message_bytes_total"] != 2*size {
		t.Errorf("outboxd_foreign_messages_total %v, outboxd_foreign_message_bytes_total %v; want 2 and %d",
			got["outboxd_foreign_messages_total"], got["outboxd_foreign_message_bytes_total"], 2*size)
	}
	if !strings.Contains(d.Out.String(), `"prefix": "stranger"`) || !strings.Contains(d.Out.String(), `"bytes": 200000000`) {
		t.Errorf("no warning naming the foreign message's prefix and size:\n%s", d.P.Tail(20))
	}
	d.Stop()
}

// TestRunOwnPrefixMessageDoesNotSizeMemory: a role with no grants emits a
// message of 200 MB with outboxd's own prefix, shaped like outbox_emit's
// but forged, and the trusted writer calls outbox_emit with a payload of
// 200 MB, between outbox rows. Neither is held: outboxd's peak RSS stays
// within the memory bound at a 16 MiB budget, every row arrives, the
// forged one is counted as rejected (bad_mac) and the authentic one, too
// large to publish, is dead-lettered with its topic and key and without
// its payload. Before, both were read whole (the MAC covers the whole
// content), so a stranger could make outboxd hold 1 GB.
//
// OUTBOXD_BENCH_STRANGER_BYTES sets the forged message's size and
// OUTBOXD_BENCH_STRANGER_BUDGET the budget (make bench-stranger: 1 GB at
// the Kubernetes manifest's 32 MiB, against its 256 MiB limit); the
// authentic one stays at 200 MB, as jsonb holds at most 256 MB.
func TestRunOwnPrefixMessageDoesNotSizeMemory(t *testing.T) {
	t.Parallel()
	size, budget := int64(200_000_000), int64(16<<20)
	if s := os.Getenv("OUTBOXD_BENCH_STRANGER_BYTES"); s != "" {
		size, _ = strconv.ParseInt(s, 10, 64)
	}
	if s := os.Getenv("OUTBOXD_BENCH_STRANGER_BUDGET"); s != "" {
		budget, _ = strconv.ParseInt(s, 10, 64)
	}
	const authentic = 200_000_000
	e := e2e.NewEnv(t, 1)
	stranger := e.LoginRole("stranger")
	dlq := testenv.Kafka(t).Topic(t, "dlq", 1)
	d := startNoRace(e, "--max-in-flight-bytes", strconv.FormatInt(budget, 10), "--metrics-addr", "127.0.0.1:0", "--dead-letter-topic", dlq)
	m := e2e.MetricsAddrLog.FindStringSubmatch(d.Out.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", d.Out.String())
	}
	base := "http://" + m[1]
	ctx := context.Background()
	c := e.Conn()
	defer c.Close(ctx)
	insert := `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, jsonb_build_object('n', $2::int))`
	if _, err := c.Exec(ctx, insert, e.Topic, 1); err != nil {
		t.Fatal(err)
	}
	sc, err := pgx.Connect(ctx, stranger)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close(ctx)
	// repeat() runs in the server: the test process holds none of it.
	if _, err := sc.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', 'v3:' || repeat('0', 64) || ':1:' || repeat('x', $1))`, size); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, insert, e.Topic, 2); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insert, e.Topic, 3); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT outbox_emit($1, 'big-key', jsonb_build_object('pad', repeat('y', $2)))`, e.Topic, authentic); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, e.Topic, 4)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, insert, e.Topic, 5); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(5 * time.Minute)
	dead := testenv.Kafka(t).ReadAll(t, dlq, 1, 2*time.Minute)
	peak := d.PeakRSS()
	bound := memBound(t, d)
	got := e2e.Scrape(t, base)
	t.Logf("own-prefix messages of %d MB (forged) and %d MB (outbox_emit) between %d rows, budget %d MiB: peak RSS %d MiB (bound %d MiB; Kubernetes limit 256 MiB); %s; rejected bad_mac %v",
		size/1_000_000, authentic/1_000_000, n, budget>>20, peak>>20, bound>>20, v, got[`outboxd_rejected_messages_total{reason="bad_mac"}`])
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != 5 {
		t.Fatalf("rows around the messages: %s (%d rows)", v, n)
	}
	if peak > bound {
		t.Errorf("peak RSS %d MiB > 2 × budget + 24 MiB + the executable = %d MiB: an own-prefix message's content was held", peak>>20, bound>>20)
	}
	if os.Getenv("OUTBOXD_BENCH_STRANGER_BYTES") != "" && peak > 256<<20 {
		t.Errorf("peak RSS %d MiB > 256 MiB, deploy/kubernetes' memory limit", peak>>20)
	}
	if r := got[`outboxd_rejected_messages_total{reason="bad_mac"}`]; r != 1 {
		t.Errorf("outboxd_rejected_messages_total{reason=\"bad_mac\"} %v, want 1: the forged message", r)
	}
	if len(dead) != 1 {
		t.Fatalf("dead-lettered %d records, want the authentic message", len(dead))
	}
	reason := e2e.Header(dead[0], "dlq-error")
	if !strings.Contains(reason, "larger than --kafka-max-message-bytes") || !strings.Contains(string(dead[0].Value), "big-key") ||
		strings.Contains(string(dead[0].Value), "yyyy") || len(dead[0].Value) > 64<<10 {
		t.Errorf("dead letter: reason %q, value of %d bytes %.200q; want the size named, the key kept, no payload", reason, len(dead[0].Value), dead[0].Value)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited:\n%s", d.P.Tail(30))
	}
	d.Stop()
}
