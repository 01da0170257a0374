// Package e2e is the harness of outboxd's end-to-end tests: it runs the
// real outboxd binary (Daemon) against the real PostgreSQL and Kafka of the
// dev stack or private servers the tests start (Env, one test's own
// database, slot, publication and topic), kills it for real where a crash is
// the point, and checks what Kafka holds against the outbox (Verify). The
// tests that use it live in cmd/outboxd (those that also call the package's
// own code) and in the packages under e2e/, one per theme; each calls Main
// from its TestMain.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
	"github.com/outboxd/outboxd/migrations"
)

// BinPath is the outboxd binary under test, set by Main.
var BinPath string

// Main is the TestMain of a package of end-to-end tests. The binary under
// test is OUTBOXD_TEST_BINARY when set (make test builds it once, with the
// race detector, and hands it to every package, instead of each package
// building its own), else it is built here, once for the package's tests:
// with the race detector, unless OUTBOXD_E2E_NORACE asks for the real speed
// of a measurement. With -short (make unit) no server is used and nothing is
// built.
func Main(m *testing.M) {
	flag.Parse()
	// -list runs no test: nothing to build for it either.
	if testing.Short() || flag.Lookup("test.list").Value.String() != "" {
		os.Exit(m.Run())
	}
	code := run(m)
	testenv.StopRegistry()
	os.Exit(code)
}

func run(m *testing.M) int {
	if bin := os.Getenv("OUTBOXD_TEST_BINARY"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err == nil {
			_, err = os.Stat(abs)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "OUTBOXD_TEST_BINARY:", err)
			return 1
		}
		BinPath = abs
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "outboxd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	build := testproc.Build
	if os.Getenv("OUTBOXD_E2E_NORACE") != "" {
		build = testproc.BuildNoRace
	}
	bins, err := build(dir, "./cmd/outboxd")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build outboxd:", err)
		return 1
	}
	BinPath = bins["outboxd"]
	return m.Run()
}

// Daemon is one outboxd process, run by testproc.
type Daemon struct {
	T   testing.TB
	P   *testproc.Proc
	Out Output // what it printed: d.Out.String()
	// code is the exit code, set before done is closed (so it may be read
	// once exited or wait saw the exit).
	Code int
	done chan struct{}
}

// StartDaemon starts outboxd with args (and no OUTBOXD_* environment); it
// is killed at cleanup if still running.
func StartDaemon(t testing.TB, args ...string) *Daemon {
	t.Helper()
	return NewDaemon(t, testproc.Start(t, BinPath, args...))
}

// NewDaemon watches p, an outboxd process started some other way (another
// binary, another environment).
func NewDaemon(t testing.TB, p *testproc.Proc) *Daemon {
	d := &Daemon{T: t, P: p, Out: Output{p}, done: make(chan struct{})}
	go func() {
		<-p.Done()
		d.Code = p.ExitCode()
		close(d.done)
	}()
	return d
}

// Output is a process's output so far as a fmt.Stringer.
type Output struct{ p *testproc.Proc }

func (o Output) String() string { return o.p.Output() }

func (d *Daemon) PID() int { return d.P.PID() }

func (d *Daemon) Exited() bool {
	if !d.P.Exited() {
		return false
	}
	<-d.done // d.code is set
	return true
}

// Wait waits for the process to exit and returns its exit code.
func (d *Daemon) Wait(timeout time.Duration) int {
	d.T.Helper()
	d.P.Wait(timeout)
	<-d.done
	return d.Code
}

func (d *Daemon) Kill9() {
	d.T.Helper()
	_ = d.P.Kill()
	d.Wait(10 * time.Second)
}

// Stop sends SIGTERM and asserts a clean exit.
func (d *Daemon) Stop() {
	d.T.Helper()
	_ = d.P.Signal(syscall.SIGTERM)
	if code := d.Wait(60 * time.Second); code != 0 {
		d.T.Fatalf("outboxd exited %d after SIGTERM, want 0", code)
	}
}

// WaitLog waits until the output contains s.
func (d *Daemon) WaitLog(s string, timeout time.Duration) {
	d.T.Helper()
	d.P.WaitOutput(s, timeout)
}

// PeakRSS is the process's peak resident set size in bytes (-1 if unknown).
func (d *Daemon) PeakRSS() int64 {
	rss, err := testproc.PeakRSS(d.PID())
	if err != nil {
		return -1
	}
	return rss
}

// Env is one test's outbox: its own database, slot, publication and topic.
type Env struct {
	T       testing.TB
	DSN     string
	Brokers []string
	Topic   string
	Slot    string
}

func NewEnv(t testing.TB, partitions int32) *Env {
	t.Helper()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	e := &Env{T: t, DSN: pg.DSN, Brokers: k.Brokers, Topic: k.Topic(t, "e2e", partitions), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	return e
}

func (e *Env) Migrate() {
	e.T.Helper()
	conn := e.Conn()
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(context.Background(), conn, zap.NewNop()); err != nil {
		e.T.Fatalf("migrate: %v", err)
	}
}

func (e *Env) Conn() *pgx.Conn {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, e.DSN)
	if err != nil {
		e.T.Fatalf("connect: %v", err)
	}
	return c
}

func (e *Env) Exec(sql string, args ...any) {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), sql, args...); err != nil {
		e.T.Fatalf("%s: %v", sql, err)
	}
}

// WaitConfirmed waits until the slot has confirmed everything written
// before the call (pg_current_wal_lsn() then), polling with a deadline.
func (e *Env) WaitConfirmed(timeout time.Duration) {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	var target string
	if err := c.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		e.T.Fatal(err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var caught bool
		if err := c.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, e.Slot, target).Scan(&caught); err != nil {
			e.T.Fatal(err)
		}
		if caught {
			return
		}
		if time.Now().After(deadline) {
			e.T.Fatalf("confirmed_flush_lsn of slot %s did not reach %s within %s", e.Slot, target, timeout)
		}
		time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
	}
}

func (e *Env) Args(extra ...string) []string {
	a := []string{"run", "--pg-dsn", e.DSN, "--kafka-brokers", strings.Join(e.Brokers, ","),
		"--slot", e.Slot, "--publication", e.Slot, "--status-interval", "200ms",
		"--restart-backoff-min", "200ms", "--restart-backoff-max", "2s", "--standby-poll-interval", "500ms"}
	return append(a, extra...)
}

func (e *Env) Start(extra ...string) *Daemon {
	e.T.Helper()
	d := StartDaemon(e.T, e.Args(extra...)...)
	d.WaitLog("streaming", 60*time.Second)
	return d
}

// Load writes total outbox rows from writers concurrent writers, each owning
// its own aggregates (so per key, commit order is id order), in transactions
// of 1..maxTxn rows.
type Load struct {
	Writers, Aggregates, Total, MaxTxn int
	Pause                              time.Duration // between transactions
}

func (e *Env) Write(ctx context.Context, l Load) error {
	var wg sync.WaitGroup
	errs := make(chan error, l.Writers)
	per := l.Total / l.Writers
	for w := 0; w < l.Writers; w++ {
		n := per
		if w == l.Writers-1 {
			n = l.Total - per*(l.Writers-1)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.writer(ctx, w, n, l)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (e *Env) writer(ctx context.Context, w, n int, l Load) error {
	conn, err := pgx.Connect(ctx, e.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	seq := 0
	for seq < n {
		size := min(1+rng.IntN(l.MaxTxn), n-seq)
		aggs := make([]string, size)
		payloads := make([]string, size)
		for i := range size {
			a := w + l.Writers*rng.IntN(max(1, l.Aggregates/l.Writers))
			aggs[i] = fmt.Sprintf("agg-%d", a)
			payloads[i] = fmt.Sprintf(`{"writer": %d, "seq": %d, "note": "ünïcode \"quoted\""}`, w, seq+i)
		}
		_, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload)
			SELECT a, $1, p::jsonb FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS t(a, p, o) ORDER BY o`,
			e.Topic, aggs, payloads)
		if err != nil {
			return fmt.Errorf("writer %d: %w", w, err)
		}
		seq += size
		if l.Pause > 0 {
			time.Sleep(l.Pause)
		}
	}
	return nil
}

// Row is an outbox row as stored.
type Row struct {
	Agg, Payload, Topic string
}

func (e *Env) Rows() map[int64]Row {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	rs, err := c.Query(context.Background(), `SELECT id, aggregate_id, payload::text, topic FROM outbox`)
	if err != nil {
		e.T.Fatal(err)
	}
	out := map[int64]Row{}
	for rs.Next() {
		var id int64
		var r Row
		if err := rs.Scan(&id, &r.Agg, &r.Payload, &r.Topic); err != nil {
			e.T.Fatal(err)
		}
		out[id] = r
	}
	if rs.Err() != nil {
		e.T.Fatal(rs.Err())
	}
	return out
}

// Consume reads topic from the oldest offset until every id in want was seen
// and nothing new arrived for quiet, or timeout.
func Consume(t testing.TB, brokers []string, topic string, want map[int64]Row, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	// As consumers of exactly-once publishing must: aborted records are
	// never seen (no difference for at-least-once).
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	c, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		t.Fatalf("partitions: %v", err)
	}
	msgs := make(chan *sarama.ConsumerMessage, 1024)
	for _, p := range parts {
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatalf("consume: %v", err)
		}
		defer pc.Close()
		go func() {
			for m := range pc.Messages() {
				msgs <- m
			}
		}()
	}
	var got []*sarama.ConsumerMessage
	seen := map[int64]bool{}
	deadline := time.After(timeout)
	const quiet = 1500 * time.Millisecond
	for {
		q := time.After(quiet)
		if len(seen) < len(want) {
			q = nil
		}
		select {
		case m := <-msgs:
			got = append(got, m)
			if id, err := strconv.ParseInt(Header(m, "outbox-id"), 10, 64); err == nil {
				seen[id] = true
			}
		case <-q:
			return got
		case <-deadline:
			t.Logf("consume: timeout with %d of %d ids seen", len(seen), len(want))
			return got
		}
	}
}

func Header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// Ranges prints sorted ids as "a-b c-d ..." (first 20 runs).
func Ranges(ids []int64) string {
	var b strings.Builder
	runs := 0
	for i := 0; i < len(ids) && runs < 20; runs++ {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		fmt.Fprintf(&b, "%d-%d ", ids[i], ids[j])
		i = j + 1
	}
	return b.String()
}

// Delivered reads the test's topic until every outbox row arrived (or
// timeout) and returns the verdict and the number of rows.
func (e *Env) Delivered(timeout time.Duration) (Verdict, int) {
	e.T.Helper()
	want := e.Rows()
	return Verify(e.T, want, Consume(e.T, e.Brokers, e.Topic, want, timeout)), len(want)
}

type Verdict struct {
	Lost, Duplicated, Reordered, Corrupt int
}

func (v Verdict) String() string {
	return fmt.Sprintf("lost=%d duplicated=%d reordered=%d corrupt=%d", v.Lost, v.Duplicated, v.Reordered, v.Corrupt)
}

// Verify compares what Kafka holds with the outbox: every row present with
// key, value and headers byte-exact; per key, first deliveries in id order
// (= commit order, since each key has one sequential writer).
func Verify(t testing.TB, want map[int64]Row, got []*sarama.ConsumerMessage) Verdict {
	t.Helper()
	var v Verdict
	seen := map[int64]int{}
	// Per partition in offset order; keys never span partitions.
	byPart := map[int32][]*sarama.ConsumerMessage{}
	for _, m := range got {
		byPart[m.Partition] = append(byPart[m.Partition], m)
	}
	for _, ms := range byPart {
		maxID := map[string]int64{}
		for _, m := range ms {
			id, err := strconv.ParseInt(Header(m, "outbox-id"), 10, 64)
			r, ok := want[id]
			if err != nil || !ok {
				if v.Corrupt < 3 {
					t.Logf("record with unknown outbox id %q at %s/%d@%d: key %q value %q", Header(m, "outbox-id"), m.Topic, m.Partition, m.Offset, m.Key, m.Value)
				}
				v.Corrupt++
				continue
			}
			if string(m.Key) != r.Agg || string(m.Value) != r.Payload || Header(m, "aggregate-id") != r.Agg {
				if v.Corrupt < 3 {
					t.Logf("corrupt record id %d: key %q value %q, want %q %q", id, m.Key, m.Value, r.Agg, r.Payload)
				}
				v.Corrupt++
			}
			seen[id]++
			if seen[id] > 1 {
				v.Duplicated++
				continue
			}
			if id < maxID[r.Agg] {
				v.Reordered++
			}
			maxID[r.Agg] = max(maxID[r.Agg], id)
		}
	}
	var missing []int64
	for id := range want {
		if seen[id] == 0 {
			v.Lost++
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Logf("missing ids: %s", Ranges(missing))
	}
	return v
}
