package operations

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
)

// slotExists reports whether the env's slot exists.
func slotExists(e *e2e.Env) bool {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&n); err != nil {
		e.T.Fatal(err)
	}
	return n != 0
}

// expectStartFailure runs outboxd and asserts that it exits 1 within the
// start checks' bound, its last line containing want.
func expectStartFailure(t *testing.T, want string, args ...string) {
	t.Helper()
	d := e2e.StartDaemon(t, args...)
	code := d.Wait(90 * time.Second)
	if got := e2e.LastLine(d.Out.String()); code != 1 || !strings.Contains(got, want) {
		t.Fatalf("exit %d, last line:\n  %s\nwant exit 1 and a line containing:\n  %s", code, got, want)
	}
}

// TestRunFailsFastAtStart: both sources follow one rule (start.go): what
// waiting cannot fix ends the process at start with one line, and an
// unreachable broker never leaves a new slot behind.
func TestRunFailsFastAtStart(t *testing.T) {
	t.Parallel()
	t.Run("cdc, broker unreachable: exit, and no slot created", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		expectStartFailure(t, "Kafka: no broker of --kafka-brokers", "run", "--pg-dsn", e.DSN, "--kafka-brokers", e2e.ClosedPort(t),
			"--slot", e.Slot, "--publication", e.Slot, "--start-timeout", "0")
		if slotExists(e) {
			t.Errorf("the slot was created although Kafka was unreachable")
		}
	})
	t.Run("poll, database unreachable", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		expectStartFailure(t, "connect to PostgreSQL", "run", "--source", "poll",
			"--pg-dsn", "postgres://postgres@"+e2e.ClosedPort(t)+"/outboxd?sslmode=disable",
			"--kafka-brokers", strings.Join(e.Brokers, ","), "--start-timeout", "0")
	})
	// A server that refuses is tried again within --start-timeout, each
	// attempt logged, and then the same one line ends the process: the wait
	// is bounded and never silent.
	for _, c := range []struct {
		name, refusing, logged, last string
		args                         func(e *e2e.Env, addr string) []string
	}{
		{"cdc, broker refusing", "Kafka", "Kafka is not reachable yet", "Kafka: no broker of --kafka-brokers", func(e *e2e.Env, addr string) []string {
			return []string{"run", "--pg-dsn", e.DSN, "--kafka-brokers", addr, "--slot", e.Slot, "--publication", e.Slot}
		}},
		{"cdc, database refusing", "PostgreSQL", "PostgreSQL is not reachable yet", "connect to PostgreSQL", func(e *e2e.Env, addr string) []string {
			return []string{"run", "--pg-dsn", "postgres://postgres@" + addr + "/outboxd?sslmode=disable", "--kafka-brokers", strings.Join(e.Brokers, ","),
				"--slot", e.Slot, "--publication", e.Slot}
		}},
	} {
		t.Run(c.name+": tried again within --start-timeout, each attempt logged", func(t *testing.T) {
			t.Parallel()
			e := e2e.NewEnv(t, 1)
			d := e2e.StartDaemon(t, append(c.args(e, e2e.ClosedPort(t)), "--start-timeout", "3s")...)
			code := d.Wait(90 * time.Second)
			out := d.Out.String()
			if got := e2e.LastLine(out); code != 1 || !strings.Contains(got, c.last) {
				t.Fatalf("exit %d, last line:\n  %s\nwant exit 1 and a line containing %q\n%s", code, got, c.last, out)
			}
			// About one attempt a second within 3 s: the first and at
			// least one more are logged before the final error.
			if n := strings.Count(out, c.logged); n < 2 {
				t.Errorf("%d attempts logged as %q, want ≥ 2 within --start-timeout 3s:\n%s", n, c.logged, out)
			}
			if slotExists(e) {
				t.Errorf("the slot was created although %s refused", c.refusing)
			}
		})
	}
	t.Run("poll, table without published_at", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1) // outboxd migrate, not --source=poll
		expectStartFailure(t, `has no column "published_at": run "outboxd migrate --source=poll"`,
			"run", "--source", "poll", "--pg-dsn", e.DSN, "--kafka-brokers", strings.Join(e.Brokers, ","))
	})
	t.Run("poll, unknown host", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		expectStartFailure(t, "connect to PostgreSQL", "run", "--source", "poll",
			"--pg-dsn", "postgres://postgres@no-such-host.invalid:5432/x", "--kafka-brokers", strings.Join(e.Brokers, ","))
	})
}

// TestConfigCheckConnect: config check --connect runs run's start checks,
// creating nothing, and names each failing one.
func TestConfigCheckConnect(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	brokers := strings.Join(e.Brokers, ",")
	d := e2e.StartDaemon(t, "config", "check", "--connect", "--pg-dsn", e.DSN, "--kafka-brokers", brokers, "--slot", e.Slot, "--publication", e.Slot)
	if code := d.Wait(90 * time.Second); code != 0 || !strings.Contains(d.Out.String(), "outboxd run can start") {
		t.Fatalf("a good configuration: exit %d:\n%s", code, d.Out.String())
	}
	d = e2e.StartDaemon(t, "config", "check", "--connect", "--pg-dsn", e.DSN, "--kafka-brokers", e2e.ClosedPort(t), "--table", "nosuch", "--slot", e.Slot,
		"--start-timeout", "2s")
	code := d.Wait(90 * time.Second)
	out := d.Out.String()
	if code != 1 || strings.Count(out, "  FAIL ") != 2 || !strings.Contains(out, "outbox table public.nosuch does not exist") {
		t.Fatalf("a bad configuration: exit %d, want 1 and two FAIL lines:\n%s", code, out)
	}
	if !strings.Contains(out, "Kafka is not reachable yet") {
		t.Errorf("config check --connect waited for Kafka without a line saying so:\n%s", out)
	}
	c := e.Conn()
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&n); err != nil || n != 0 {
		t.Errorf("config check created the slot (%d, %v)", n, err)
	}
}

// The metrics address is opened before anything connects: a busy one ends
// run at once, having created no slot (a new slot would pin WAL with nobody
// reading it); and /healthz answers while start-up still waits for Kafka, so
// a liveness probe sees a live process, with /readyz saying "starting".
func TestRunServesHealthBeforeItConnects(t *testing.T) {
	t.Parallel()
	t.Run("busy metrics address: exit, and no slot created", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		expectStartFailure(t, "--metrics-addr", "run", "--pg-dsn", e.DSN, "--kafka-brokers", strings.Join(e.Brokers, ","),
			"--slot", e.Slot, "--publication", e.Slot, "--metrics-addr", busy.Addr().String())
		if slotExists(e) {
			t.Errorf("the slot was created although --metrics-addr could not be opened")
		}
	})
	t.Run("healthz while Kafka is unreachable", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		addr := e2e.ClosedPort(t)
		d := e2e.StartDaemon(t, "run", "--pg-dsn", e.DSN, "--kafka-brokers", e2e.ClosedPort(t),
			"--slot", e.Slot, "--publication", e.Slot, "--metrics-addr", addr)
		defer d.Kill9()
		get := func(path string) (int, string) {
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				return 0, err.Error()
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, _ := get("/healthz")
			if code == http.StatusOK {
				break
			}
			if d.Exited() || time.Now().After(deadline) {
				t.Fatalf("/healthz did not answer while start-up waited for Kafka (exited: %v):\n%s", d.Exited(), d.Out.String())
			}
			time.Sleep(50 * time.Millisecond) // polling the address with a deadline
		}
		if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
			t.Errorf("/readyz during start-up: %d %q, want 503 saying starting", code, body)
		}
		if d.Exited() {
			t.Fatalf("outboxd exited while Kafka was unreachable for less than its start bound:\n%s", d.Out.String())
		}
	})
}
