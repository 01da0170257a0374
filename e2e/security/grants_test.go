package security

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// grantLine is one optional GRANT at the end of deploy/least-privilege.sql,
// commented out there, with the commands it serves after "-- for:".
var grantLine = regexp.MustCompile(`(?m)^--\s+(GRANT\s.*;)\s*-- for: (.+)$`)

// fileGrants reads the optional GRANT lines of deploy/least-privilege.sql by
// command: the test grants what the file says, so a wrong line fails it.
func fileGrants(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "least-privilege.sql"))
	if err != nil {
		t.Fatal(err)
	}
	grants := map[string][]string{}
	for _, m := range grantLine.FindAllStringSubmatch(string(b), -1) {
		for _, cmd := range strings.Split(m[2], ",") {
			cmd = strings.TrimSpace(cmd)
			grants[cmd] = append(grants[cmd], m[1])
		}
	}
	if len(grants) == 0 {
		t.Fatal(`deploy/least-privilege.sql has no optional GRANT line ending "-- for: <command>"`)
	}
	return grants
}

// lpEnv is an env (its DSN the table owner's) with the least-privilege role
// of deploy/least-privilege.sql on its outbox, the publication e.Slot.
type lpEnv struct {
	*e2e.Env
	tt     *testing.T
	role   string
	grants map[string][]string
}

func newLPEnv(t *testing.T, grants map[string][]string) *lpEnv {
	t.Helper()
	e := e2e.NewEnv(t, 1)
	role := testenv.UniqueName("outboxd_lp")
	cmd := exec.Command(psql(t), "-X", "-q", "-d", e.DSN, "-v", "role="+role, "-v", "publication="+e.Slot,
		"-f", filepath.Join(testenv.RepoRoot(t), "deploy", "least-privilege.sql"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql -f deploy/least-privilege.sql: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		e.Exec(fmt.Sprintf(`DROP PUBLICATION IF EXISTS %s; DROP OWNED BY %s; DROP ROLE %s`, e.Slot, role, role))
	})
	return &lpEnv{Env: e, tt: t, role: role, grants: grants}
}

// grant runs the file's GRANT lines for command, with psql's variables set
// as the file's defaults are.
func (l *lpEnv) grant(command string) {
	l.T.Helper()
	lines := l.grants[command]
	if len(lines) == 0 {
		l.T.Fatalf("deploy/least-privilege.sql has no GRANT line for %q", command)
	}
	cmd := exec.Command(psql(l.tt), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", l.DSN,
		"-v", "role="+l.role, "-v", "schema=public", "-v", "table=outbox", "-f", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		l.T.Fatalf("the GRANT lines for %s: %v\n%s\n%s", command, err, strings.Join(lines, "\n"), out)
	}
	l.T.Logf("granted for %s: %s", command, strings.Join(lines, " "))
}

// as is the env with the role's DSN: its args run outboxd as the role.
func (l *lpEnv) as() *e2e.Env {
	r := *l.Env
	r.DSN = strings.Replace(l.DSN, "postgres://postgres@", "postgres://"+l.role+"@", 1)
	return &r
}

// insert writes n outbox rows to e.Topic, created age ago.
func (l *lpEnv) insert(n int, age time.Duration) {
	l.T.Helper()
	l.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, created_at)
		SELECT 'agg-' || i, $1, jsonb_build_object('n', i), now() - $3::interval
		  FROM generate_series(1, $2) AS i ORDER BY i`, l.Topic, n, age.String())
}

// run runs outboxd to completion as the role and returns its exit code and
// output.
func (l *lpEnv) run(args ...string) (int, string) {
	l.T.Helper()
	return e2e.RunOnce(l.tt, args...)
}

// wantDenied asserts that a run as the role without the command's grants
// failed (exit 1) with the one-line error want.
func wantDenied(t *testing.T, what string, code int, out, want string) {
	t.Helper()
	if code != 1 || e2e.LastLine(out) != want {
		t.Fatalf("%s without its grants: exit %d, last line:\n  %s\nwant exit 1 and:\n  %s\n%s", what, code, e2e.LastLine(out), want, out)
	}
}

// TestCommandsAsLeastPrivilegeRole runs each command but run (see
// TestRunAsLeastPrivilegeRole) and migrate (the owner's) as the role of
// deploy/least-privilege.sql with exactly the optional grants the file marks
// for it: it must succeed; and, where the file marks any, the role without
// them must fail, saying what it was denied: the one-shot commands exit 1
// with it as their last line, run logs it and retries (a prune that failed
// never stops the publisher; the poller restarts on any PostgreSQL error).
// A line of another command must not make a case pass: each case gets only
// its own.
func TestCommandsAsLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	grants := fileGrants(t)
	brokers := strings.Join(testenv.Kafka(t).Brokers, ",")
	denied := "ERROR: permission denied for table outbox (SQLSTATE 42501)"

	cases := []struct {
		name   string
		grants []string // the commands of the file's GRANT lines
		test   func(t *testing.T, l *lpEnv)
	}{
		{"prune", []string{"prune"}, func(t *testing.T, l *lpEnv) {
			l.insert(5, 2*time.Hour)
			l.insert(3, 0)
			args := []string{"prune", "--pg-dsn", l.as().DSN, "--older-than", "1h"}
			code, out := l.run(args...)
			wantDenied(t, "prune", code, out, "outboxd: retention: delete from public.outbox: "+denied)
			l.grant("prune")
			if code, out := l.run(args...); code != 0 || e2e.LastLine(out) != "prune: deleted 5 outbox rows older than 1h0m0s" {
				t.Fatalf("prune with its grants: exit %d\n%s", code, out)
			}
		}},
		{"run --retention", []string{"run --retention"}, func(t *testing.T, l *lpEnv) {
			// A failed prune does not stop the publisher: it is logged and
			// tried again at the next interval.
			l.insert(5, 2*time.Hour)
			args := l.as().Args("--retention", "1h", "--retention-interval", "1h")
			d := e2e.StartDaemon(t, args...)
			d.WaitLog("retention: prune failed", 60*time.Second)
			if !strings.Contains(d.Out.String(), "retention: delete from public.outbox: "+denied) {
				t.Fatalf("run --retention without its grants: the warning does not say what was denied:\n%s", d.Out)
			}
			d.Stop()
			l.grant("run --retention")
			d = e2e.StartDaemon(t, args...)
			d.WaitLog(`retention: deleted old outbox rows	{"rows": 5`, 30*time.Second)
			d.Stop()
		}},
		{"run --source=poll", []string{"run --source=poll"}, func(t *testing.T, l *lpEnv) {
			e2e.MigrateForPoll(t, l.DSN)
			l.insert(20, 0)
			want := l.Rows()
			// No REPLICATION needed either: the polling source never opens
			// a replication connection.
			l.Exec(fmt.Sprintf(`ALTER ROLE %s NOREPLICATION`, l.role))
			args := l.as().Args("--source=poll", "--poll-interval=20ms")
			d := e2e.StartDaemon(t, args...)
			// The poller restarts, with backoff, on a denied SELECT, as on
			// any PostgreSQL error.
			d.WaitLog("poll: select: "+denied, 60*time.Second)
			d.Stop()
			l.grant("run --source=poll")
			d = e2e.StartDaemon(t, args...)
			if v := e2e.Verify(t, want, e2e.Consume(t, l.Brokers, l.Topic, want, time.Minute)); v != (e2e.Verdict{}) {
				t.Fatalf("run --source=poll with its grants: %s", v)
			}
			d.Stop()
		}},
		{"run --source=poll --retention", []string{"run --source=poll", "run --retention"}, func(t *testing.T, l *lpEnv) {
			// The polling source prunes only rows it published: the
			// DELETE also reads published_at, which the poller's SELECT
			// grant covers.
			e2e.MigrateForPoll(t, l.DSN)
			l.insert(10, 2*time.Hour)
			want := l.Rows()
			l.grant("run --source=poll")
			l.grant("run --retention")
			d := e2e.StartDaemon(t, l.as().Args("--source=poll", "--poll-interval=20ms", "--retention", "1h", "--retention-interval", "200ms")...)
			if v := e2e.Verify(t, want, e2e.Consume(t, l.Brokers, l.Topic, want, time.Minute)); v != (e2e.Verdict{}) {
				t.Fatalf("run --source=poll --retention: %s", v)
			}
			c := l.Conn()
			defer c.Close(context.Background())
			for deadline := time.Now().Add(30 * time.Second); ; {
				var n int
				if err := c.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("run --source=poll --retention: %d published rows older than 1h left after 30s\n%s", n, d.Out)
				}
				time.Sleep(100 * time.Millisecond) // polling a condition with a deadline
			}
			if strings.Contains(d.Out.String(), "retention: prune failed") {
				t.Fatalf("run --source=poll --retention: a prune failed:\n%s", d.Out)
			}
			d.Stop()
		}},
		{"replay", []string{"replay"}, func(t *testing.T, l *lpEnv) {
			l.insert(20, 0)
			want := l.Rows()
			args := append([]string{"replay"}, l.as().Args("--from-id", "1")[1:]...)
			code, out := l.run(args...)
			wantDenied(t, "replay", code, out, "outboxd: replay stopped after 0 rows: poll: select: "+denied)
			l.grant("replay")
			if code, out := l.run(args...); code != 0 || e2e.LastLine(out) != "replay: 20 rows published again" {
				t.Fatalf("replay with its grants: exit %d\n%s", code, out)
			}
			if v := e2e.Verify(t, want, e2e.Consume(t, l.Brokers, l.Topic, want, time.Minute)); v != (e2e.Verdict{}) {
				t.Fatalf("replay with its grants: %s", v)
			}
		}},
		{"replay --resume", []string{"replay"}, func(t *testing.T, l *lpEnv) {
			// Then it runs: what run needs, which the base role has.
			l.insert(20, 0)
			args := append([]string{"replay"}, l.as().Args("--from-id", "1", "--resume")[1:]...)
			code, out := l.run(args...)
			wantDenied(t, "replay --resume", code, out, "outboxd: replay stopped after 0 rows: poll: select: "+denied)
			l.grant("replay")
			d := e2e.StartDaemon(t, args...)
			d.WaitLog("streaming", 60*time.Second)
			l.insert(10, 0)
			want := l.Rows()
			if v := e2e.Verify(t, want, e2e.Consume(t, l.Brokers, l.Topic, want, time.Minute)); v != (e2e.Verdict{}) {
				t.Fatalf("replay --resume with its grants: %s", v)
			}
			d.Stop()
		}},
		{"audit", []string{"audit"}, func(t *testing.T, l *lpEnv) {
			l.insert(20, 0)
			// Half published by the owner, half missing: --repair
			// republishes those through replay's path, then audits again.
			if code, out := e2e.RunOnce(t, append([]string{"replay"}, l.Args("--from-id", "1", "--to-id", "10")[1:]...)...); code != 0 {
				t.Fatalf("replay as the owner: exit %d\n%s", code, out)
			}
			args := []string{"audit", "--pg-dsn", l.as().DSN, "--kafka-brokers", brokers,
				"--slot", l.Slot, "--publication", l.Slot, "--stable-timeout", "10s", "--from-id", "1", "--repair"}
			code, out := l.run(args...)
			wantDenied(t, "audit", code, out, "outboxd: audit: read the ids of public.outbox: "+denied)
			l.grant("audit")
			code, out = l.run(args...)
			if code != 0 || !strings.Contains(out, "audit: republished 10 missing rows; auditing again") ||
				!strings.Contains(out, "clean: every row in range") {
				t.Fatalf("audit --repair with its grants: exit %d\n%s", code, out)
			}
		}},
		{"checkpoint reset", []string{"checkpoint reset"}, func(t *testing.T, l *lpEnv) {
			// A checkpoint that knows the highest id published, written by
			// run as the role, so that the reset moves the sequence.
			k := testenv.Kafka(t)
			cp := []string{"--checkpoint-topic", testenv.UniqueName("lp-cp")}
			t.Cleanup(func() { _ = k.DeleteTopic(cp[1]) }) // run creates it compacted
			r := l.as()
			d := e2e.StartDaemon(t, r.Args(cp...)...)
			d.WaitLog("streaming", 60*time.Second)
			l.insert(10, 0)
			l.WaitConfirmed(60 * time.Second)
			d.Stop()
			args := append([]string{"checkpoint", "reset", "--to-current-history"}, r.Args(cp...)[1:]...)
			code, out := l.run(args...)
			wantDenied(t, "checkpoint reset", code, out,
				"outboxd: move sequence public.outbox_id_seq past 10: ERROR: permission denied for sequence outbox_id_seq (SQLSTATE 42501)")
			l.grant("checkpoint reset")
			if code, out := l.run(args...); code != 0 || !strings.Contains(out, "sequence public.outbox_id_seq moved past outbox id 10 (next id 11)") {
				t.Fatalf("checkpoint reset with its grants: exit %d\n%s", code, out)
			}
		}},
		{"status", nil, func(t *testing.T, l *lpEnv) {
			l.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, l.Slot)
			cp := testenv.Kafka(t).Topic(t, "lp-cp", 1)
			code, out := l.run("status", "--pg-dsn", l.as().DSN, "--slot", l.Slot, "--publication", l.Slot,
				"--allow-inactive", "--kafka-brokers", brokers, "--checkpoint-topic", cp)
			if code != 0 || !strings.Contains(out, "status           OK") {
				t.Fatalf("status as the role: exit %d\n%s", code, out)
			}
		}},
	}

	// Every command the file grants something for has its case, and every
	// case's grants are in the file.
	covered := map[string]bool{}
	for _, c := range cases {
		for _, g := range c.grants {
			covered[g] = true
		}
	}
	for cmd := range grants {
		if !covered[cmd] {
			t.Errorf("deploy/least-privilege.sql grants for %q, which no case runs", cmd)
		}
	}
	for cmd := range covered {
		if grants[cmd] == nil {
			t.Errorf("deploy/least-privilege.sql has no GRANT line for %q", cmd)
		}
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLPEnv(t, grants)
			l.grants = map[string][]string{}
			for _, g := range c.grants {
				l.grants[g] = grants[g]
			}
			c.test(t, l)
		})
	}
}
