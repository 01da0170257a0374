package operations

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/internal/e2e"
)

// runAudit runs "outboxd audit" with args and returns its exit code and
// stdout.
func runAudit(e *e2e.Env, args ...string) (int, string) {
	e.T.Helper()
	a := append([]string{"audit", "--pg-dsn", e.DSN, "--kafka-brokers", strings.Join(e.Brokers, ","),
		"--slot", e.Slot, "--publication", e.Slot, "--stable-timeout", "30s"}, args...)
	cmd := exec.Command(e2e.BinPath, a...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.T.Fatal(err)
	}
	e.T.Logf("outboxd %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return code, out.String()
}

// TestAuditAfterRunIsCleanAndRepairFillsWhatIsMissing: what outboxd run
// published (rows with and without a headers column value, two
// partitions, the origin header) audits clean — the audit rebuilds records
// as outboxd builds them; rows written while no outboxd ran, with the slot
// moved past them, are missing (exit 1), and --repair republishes exactly
// those, after which the audit is clean again. A range that is not one is a
// usage error (exit 2).
func TestAuditAfterRunIsCleanAndRepairFillsWhatIsMissing(t *testing.T) {
	e := e2e.NewEnv(t, 2)
	d := e.Start()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, headers)
		SELECT 'agg-' || (i % 7), $1, jsonb_build_object('n', i),
		       CASE WHEN i % 3 = 0 THEN jsonb_build_object('traceparent', 'tp-' || i) END
		  FROM generate_series(1, 200) AS i ORDER BY i`, e.Topic)
	e.WaitConfirmed(60 * time.Second)
	d.Stop()

	if code, out := runAudit(e, "--from-id", "1"); code != 0 || !strings.Contains(out, "clean: every row in range") {
		t.Fatalf("after run: exit %d, want 0 and clean", code)
	}
	code, out := runAudit(e, "--from-id", "1", "--json")
	var rep audit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.Clean || len(rep.Topics) != 1 || rep.Topics[0].Rows != 200 {
		t.Fatalf("--json: exit %d, %v, report %+v; want 0, clean with 200 rows", code, err, rep)
	}

	// Rows no outboxd published: the slot is moved past them, as after a
	// lost slot recreated.
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, headers)
		SELECT 'agg-' || (i % 7), $1, jsonb_build_object('late', i), jsonb_build_object('traceparent', 'late-' || i) FROM generate_series(1, 5) AS i`, e.Topic)
	e.Exec(`SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, e.Slot)
	if code, out := runAudit(e, "--from-id", "1"); code != 1 || !strings.Contains(out, "missing: ids 201, 202, 203, 204, 205") {
		t.Fatalf("missing: exit %d, want 1 naming ids 201-205", code)
	}
	if code, out := runAudit(e, "--from-id", "1", "--repair"); code != 0 || !strings.Contains(out, "clean: every row in range") {
		t.Fatalf("--repair: exit %d, want 0 and clean after the repair", code)
	}

	if code, out := runAudit(e, "--help"); code != 0 || !strings.Contains(out, "--from-id") || !strings.Contains(out, "--repair") {
		t.Errorf("outboxd audit --help: exit %d, want 0 listing --from-id and --repair", code)
	}
	for _, args := range [][]string{{}, {"--from-id", "5", "--since", "2026-01-01T00:00:00Z"}, {"--since", "yesterday"}, {"--from-id", "9", "--to-id", "3"}} {
		if code, _ := runAudit(e, args...); code != 2 {
			t.Errorf("outboxd audit %v: exit %d, want 2 (usage)", args, code)
		}
	}
}

// TestAuditPublishFence: outbox_wait_published answers true once outboxd
// confirmed a position read after a commit (Kafka has the event), false at
// the timeout while no outboxd runs, and an error for a slot that does not
// exist.
func TestAuditPublishFence(t *testing.T) {
	e := e2e.NewEnv(t, 1)
	addr := e2e.ClosedPort(t)
	d := e.Start("--metrics-addr", addr)
	ctx := context.Background()
	c := e.Conn()
	defer c.Close(ctx)
	fence := func(timeout string) (bool, error) {
		e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('a', $1, '{}')`, e.Topic)
		var ok bool
		err := c.QueryRow(ctx, `SELECT outbox_wait_published(pg_current_wal_lsn(), $1::interval, $2)`, timeout, e.Slot).Scan(&ok)
		return ok, err
	}
	if ok, err := fence("60 seconds"); err != nil || !ok {
		t.Fatalf("with outboxd running: %v, %v; want true", ok, err)
	}
	// The same fence over HTTP, for a second event: 200, and then the
	// audit finds both in Kafka.
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('a', $1, '{}')`, e.Topic)
	if code, body := httpFence(t, addr, walLSN(e), "60s"); code != http.StatusOK || !strings.Contains(body, "published: confirmed") {
		t.Fatalf("GET /published with outboxd running: %d %q, want 200", code, body)
	}
	if code, _ := runAudit(e, "--from-id", "1"); code != 0 {
		t.Fatalf("audit right after the fence: exit %d, want 0 (the events are in Kafka)", code)
	}
	if code, body := httpFence(t, addr, "FFFFFFFF/0", "300ms"); code != http.StatusGatewayTimeout || !strings.Contains(body, "not yet") {
		t.Errorf("GET /published for a position not reached: %d %q, want 504 not yet", code, body)
	}
	if code, body := httpFence(t, addr, "nonsense", "1s"); code != http.StatusBadRequest {
		t.Errorf("GET /published?lsn=nonsense: %d %q, want 400", code, body)
	}
	d.Stop()
	start := time.Now()
	if ok, err := fence("300 milliseconds"); err != nil || ok {
		t.Fatalf("with outboxd stopped: %v, %v; want false", ok, err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Fatalf("false after %s, before the timeout", waited)
	}
	var ok bool
	if err := c.QueryRow(ctx, `SELECT outbox_wait_published(pg_current_wal_lsn(), '1 second', 'no_such_slot')`).Scan(&ok); err == nil ||
		!strings.Contains(err.Error(), `no replication slot named "no_such_slot"`) {
		t.Fatalf("unknown slot: %v, %v; want an error naming it", ok, err)
	}
}

// httpFence asks the daemon at addr's GET /published and returns the
// status and body (0 and the error when it does not answer).
func httpFence(t *testing.T, addr, lsn, timeout string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/published?lsn=" + url.QueryEscape(lsn) + "&timeout=" + timeout)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// walLSN is the server's WAL position now, read after a commit.
func walLSN(e *e2e.Env) string {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var lsn string
	if err := c.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		e.T.Fatal(err)
	}
	return lsn
}

// TestAuditExactlyOnceRunIsClean: records outboxd published in Kafka
// transactions (control batches between them, the checkpoint inside) audit
// clean, and a publish fence on that run answers once they are committed.
func TestAuditExactlyOnceRunIsClean(t *testing.T) {
	e := e2e.NewEnv(t, 3)
	addr := e2e.ClosedPort(t)
	d := e.Start("--delivery", "exactly-once", "--metrics-addr", addr)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
		SELECT 'agg-' || (i % 5), $1, jsonb_build_object('n', i) FROM generate_series(1, 300) AS i ORDER BY i`, e.Topic)
	c := e.Conn()
	defer c.Close(context.Background())
	if code, body := httpFence(t, addr, walLSN(e), "60s"); code != http.StatusOK {
		t.Fatalf("GET /published: %d %q, want 200", code, body)
	}
	var ok bool
	if err := c.QueryRow(context.Background(), `SELECT outbox_wait_published(pg_current_wal_lsn(), '60 seconds', $1)`, e.Slot).Scan(&ok); err != nil || !ok {
		t.Fatalf("fence: %v, %v; want true", ok, err)
	}
	if code, out := runAudit(e, "--from-id", "1", "--delivery", "exactly-once"); code != 0 || !strings.Contains(out, "clean: every row in range") {
		t.Fatalf("exactly-once: exit %d, want 0 and clean", code)
	}
	d.Stop()
}
