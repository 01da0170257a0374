package faults

// A database that goes back in time: outboxd refuses with one
// message, outboxd checkpoint reset --to-current-history is the one step to
// go on, and the consumer package then processes every event written after
// the rewind, none dropped as a duplicate of an event from before it.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// recorder is a consumer of the test topic (the consumer package, its dedup
// table on the dev stack's PostgreSQL) whose handler records every (origin,
// id) it processes.
type recorder struct {
	pool *pgxpool.Pool
	c    *consumer.Consumer
}

func startRecorder(t *testing.T, brokers []string, topics ...string) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pg := testenv.Postgres(t)
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.Topics, cfg.GroupID = brokers, topics, testenv.UniqueName("group")
	if err := consumer.Migrate(ctx, pool, cfg.DedupTable); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (origin text, id bigint, PRIMARY KEY (origin, id))`); err != nil {
		t.Fatal(err)
	}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, m.Origin, m.OutboxID)
		return err
	})
	c, err := consumer.New(cfg, pool, h, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); pool.Close() })
	return &recorder{pool: pool, c: c}
}

// processed waits until the handler processed every id of want under an
// origin ending in suffix (or timeout) and returns the ids missing.
func (r *recorder) processed(t *testing.T, want []int64, suffix string, timeout time.Duration) []int64 {
	t.Helper()
	var missing []int64
	e2e.WaitFor(t, timeout, func() bool {
		rows, _ := r.pool.Query(context.Background(), `SELECT w FROM unnest($1::bigint[]) AS w
WHERE NOT EXISTS (SELECT FROM effects WHERE id = w AND origin LIKE '%' || $2)`, want, suffix)
		var err error
		if missing, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			t.Fatal(err)
		}
		return len(missing) == 0
	})
	return missing
}

// ids lists the outbox ids in the env's table, with where (SQL) if given.
func idsWhere(e *e2e.Env, where string) []int64 {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	rows, _ := c.Query(context.Background(), `SELECT id FROM outbox `+where+` ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		e.T.Fatal(err)
	}
	return ids
}

// basebackup takes a pg_basebackup of srv into a folder of its instance.
func basebackup(t *testing.T, srv *testenv.PGServer) string {
	t.Helper()
	dir := filepath.Join(srv.Dir, "backup")
	cmd := []string{"pg_basebackup", "-d", srv.DSN, "-D", dir, "-X", "stream", "-c", "fast"}
	if os.Geteuid() == 0 { // the server runs as postgres (dev/stack): so must its files
		cmd = append([]string{"runuser", "-u", "postgres", "--"}, cmd...)
	}
	out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	return dir
}

// restore stops srv and replaces its data folder by backup (the old one is
// kept as data.old, its pg_wal usable as an archive); recovery, when set, is
// appended to the restored configuration. It does not start srv.
func restore(t *testing.T, srv *testenv.PGServer, backup, recovery string) {
	t.Helper()
	srv.Stop("fast")
	data := filepath.Join(srv.Dir, "data")
	if err := os.Rename(data, data+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, data); err != nil {
		t.Fatal(err)
	}
	if recovery == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(recovery); err != nil {
		t.Fatal(err)
	}
	signal := filepath.Join(data, "recovery.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(data); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			_ = os.Chown(signal, int(st.Uid), int(st.Gid))
		}
	}
}

// refuses runs outboxd on e, which must exit non-zero with the rewind
// message naming kind.
func refuses(e *e2e.Env, kind string) string {
	e.T.Helper()
	d := e2e.StartDaemon(e.T, e.Args()...)
	code := d.Wait(90 * time.Second)
	out := d.Out.String()
	for _, s := range []string{"the database went back in time", kind, "committed 20", "outboxd checkpoint reset --to-current-history", "nothing written since has been published"} {
		if code == 0 || !strings.Contains(out, s) {
			e.T.Fatalf("outboxd run after the rewind: exit %d, want a refusal saying %q:\n%s", code, s, out)
		}
	}
	return out
}

// reset runs outboxd checkpoint reset --to-current-history on e.
func resetSlot(e *e2e.Env) string {
	e.T.Helper()
	args := append([]string{"checkpoint", "reset", "--to-current-history"}, e.Args()[1:]...)
	code, out := testproc.Run(e.T, 90*time.Second, e2e.BinPath, args...)
	if code != 0 {
		e.T.Fatalf("outboxd checkpoint reset: exit %d\n%s", code, out)
	}
	return out
}

// rewindCase runs one rewind end to end: 300 events, a base backup, 500
// more published past it, the rewind (do), a refusal, 200 events written by
// the application before the reset (the restored sequence hands out ids
// consumers have seen), a second refusal once the WAL moved on, the reset,
// 200 more events; every event written after the rewind is processed by the
// consumer under the new origin.
func rewindCase(t *testing.T, kind string, do func(srv *testenv.PGServer, backup, target string, e *e2e.Env)) {
	rewindCaseWith(t, kind, rewindSetup{snapshot: basebackup}, do)
}

// rewindSetup varies rewindCase: the server's version ("" is Debian's 15),
// a step before outboxd starts, and the step after the first 300 events
// instead of a base backup (its result is do's backup).
type rewindSetup struct {
	version  string
	before   func(e *e2e.Env)
	snapshot func(*testing.T, *testenv.PGServer) string
}

func rewindCaseWith(t *testing.T, kind string, rs rewindSetup, do func(srv *testenv.PGServer, backup, target string, e *e2e.Env)) {
	var srv *testenv.PGServer
	if rs.version == "" {
		srv = testenv.StartPostgres(t)
	} else {
		srv = testenv.StartPostgresVersion(t, rs.version)
	}
	e, k := e2e.ServerEnv(t, srv, 3)
	if rs.before != nil {
		rs.before(e)
	}
	ctx := context.Background()
	rec := startRecorder(t, k.Brokers, e.Topic)
	e.Exec(`ALTER SYSTEM SET wal_keep_size = '1GB'`) // the old WAL serves as a PITR archive
	e.Exec(`SELECT pg_reload_conf()`)
	d := e.Start()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 300, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	backup := rs.snapshot(t, srv)
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 100, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	var target string // a point-in-time recovery target: 100 events past the backup
	{
		c := e.Conn()
		if err := c.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&target); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
	}
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 400, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	if v, n := e.Delivered(time.Minute); v.Lost != 0 {
		t.Fatalf("before the rewind: %d rows: %s", n, v)
	}
	before := idsWhere(e, "")
	d.Stop()
	do(srv, backup, target, e)
	restored := idsWhere(e, "")
	start := time.Now()
	msg := refuses(e, kind)
	t.Logf("%s: %d of %d rows left after the rewind; refused in %s: %s", kind, len(restored), len(before),
		time.Since(start).Round(time.Millisecond), lineWith(msg, "went back in time"))

	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 200, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.Exec(`SELECT pg_switch_wal()`) // the WAL moves past the checkpoint again
	e.Exec(`CREATE TABLE churn AS SELECT generate_series(1, 1000) AS x`)
	refuses(e, kind)
	out := resetSlot(e)
	t.Logf("reset: %s", lineWith(out, "checkpoint reset:"))
	if want := fmt.Sprintf("moved past outbox id %d", before[len(before)-1]); !strings.Contains(out, want) {
		t.Fatalf("reset does not say %q:\n%s", want, out)
	}
	// outboxd replay republishes what the restored table holds since the
	// rewind, under the new origin, whatever the old checkpoint said.
	from := restored[len(restored)-1] + 1
	code, rout := testproc.Run(t, 90*time.Second, e2e.BinPath, append([]string{"replay"}, e.Args("--from-id", fmt.Sprint(from))[1:]...)...)
	if code != 0 || !strings.Contains(rout, "replay: 200 rows published again") {
		t.Fatalf("outboxd replay --from-id %d after the reset: exit %d, want 200 rows:\n%s", from, code, rout)
	}
	d = e.Start()
	defer d.Stop()
	if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 200, MaxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	after := idsWhere(e, fmt.Sprintf("WHERE id > %d OR id NOT IN (SELECT unnest('%s'::bigint[]))", before[len(before)-1], pgArray(restored)))
	if missing := rec.processed(t, after, "/1", time.Minute); len(missing) > 0 {
		t.Fatalf("%d of the %d events written after the rewind not processed by the consumer: %s", len(missing), len(after), e2e.Ranges(missing))
	}
	e2e.WaitFor(t, time.Minute, func() bool { return rec.c.Stats().Duplicates >= 200 }) // the stream's copies of the replayed rows
	st := rec.c.Stats()
	t.Logf("%s: %d events written after the rewind, all processed under generation 1; consumer totals: processed %d, duplicates %d (the 200 replayed rows, streamed again), in %s",
		kind, len(after), st.Processed, st.Duplicates, time.Since(start).Round(time.Millisecond))
	if st.Processed != int64(len(before)+len(after)) || st.Duplicates < 200 {
		t.Fatalf("consumer processed %d, want %d (%d before the rewind + %d after), and the 200 replayed rows streamed again as duplicates (got %d)",
			st.Processed, len(before)+len(after), len(before), len(after), st.Duplicates)
	}
}

func pgArray(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return "{" + strings.Join(s, ",") + "}"
}

// lineWith is the last line of out containing s.
func lineWith(out, s string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

// (a) The restore of a pg_basebackup on the same timeline.
func TestRestoreFromBaseBackupRefusesThenResetDeliversEverything(t *testing.T) {
	t.Parallel()
	rewindCase(t, "restored from a backup", func(srv *testenv.PGServer, backup, _ string, e *e2e.Env) {
		restore(t, srv, backup, "")
		srv.Start()
	})
}

// (b) A point-in-time recovery to a target before the checkpoint: a new
// timeline that left the checkpoint's before its position.
func TestPITRBeforeCheckpointRefusesThenResetDeliversEverything(t *testing.T) {
	t.Parallel()
	rewindCase(t, "history forked", func(srv *testenv.PGServer, backup, target string, e *e2e.Env) {
		restore(t, srv, backup, fmt.Sprintf("\nrestore_command = 'cp %s/%%f %%p'\nrecovery_target_lsn = '%s'\nrecovery_target_action = 'promote'\n",
			filepath.Join(srv.Dir, "data.old", "pg_wal"), target))
		srv.Start()
		e2e.WaitFor(t, time.Minute, func() bool { // promoted: writable
			c := e.Conn()
			defer c.Close(context.Background())
			var rec bool
			return c.QueryRow(context.Background(), `SELECT pg_is_in_recovery()`).Scan(&rec) == nil && !rec
		})
	})
}

// (e) A PostgreSQL 17 failover with a failover slot but without
// synchronized_standby_slots: the standby (and its synced copy of the slot)
// stopped receiving before events outboxd published from the old primary.
// The synced slot is on the new primary, behind the checkpoint, on a
// timeline that left the old one before it: refused as a fork.
func TestFailoverSlotWithoutSynchronizedStandbySlotsRefusesThenReset(t *testing.T) {
	t.Parallel()
	var standby *testenv.PGServer
	rewindCaseWith(t, "history forked", rewindSetup{version: "17",
		before: func(e *e2e.Env) { // outboxd's slot as a failover slot
			e.Exec(`CREATE PUBLICATION ` + pgx.Identifier{e.Slot}.Sanitize() + ` FOR TABLE outbox WITH (publish = 'insert')`)
			e.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, e.Slot)
		},
		snapshot: func(t *testing.T, srv *testenv.PGServer) string {
			standby = srv.StartStandby(testenv.UniqueName("phys"))
			c, err := pgx.Connect(context.Background(), srv.DSN)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			for _, sql := range []string{`ALTER SYSTEM RESET synchronized_standby_slots`, `SELECT pg_reload_conf()`} {
				if _, err := c.Exec(context.Background(), sql); err != nil {
					t.Fatal(err)
				}
			}
			catchUp(t, srv, standby)
			e2e.WaitFor(t, 90*time.Second, func() bool { // the synced copy is ready
				s, err := pgx.Connect(context.Background(), standby.DSN)
				if err != nil {
					return false
				}
				defer s.Close(context.Background())
				var ready bool
				return s.QueryRow(context.Background(), `SELECT coalesce(bool_or(synced AND NOT temporary AND invalidation_reason IS NULL), false)
FROM pg_replication_slots WHERE slot_name LIKE 'slot%'`).Scan(&ready) == nil && ready
			})
			standby.Stop("fast")
			return ""
		}}, promote(t, &standby))
}

// (c) Two outboxes (two databases, the same ids) into one topic and one
// consumer: every event is processed once, none taken for the other
// outbox's event of the same id.
func TestTwoOutboxesOneConsumerProcessEveryEventOnce(t *testing.T) {
	t.Parallel()
	a := e2e.NewEnv(t, 3)
	b := &e2e.Env{T: t, DSN: testenv.Postgres(t).DSN, Brokers: a.Brokers, Topic: a.Topic, Slot: testenv.UniqueName("slot")}
	b.Migrate()
	rec := startRecorder(t, a.Brokers, a.Topic)
	ctx := context.Background()
	start := time.Now()
	for _, e := range []*e2e.Env{a, b} {
		d := e.Start()
		defer d.Stop()
	}
	var wg sync.WaitGroup
	for _, e := range []*e2e.Env{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Write(ctx, e2e.Load{Writers: 2, Aggregates: 20, Total: 300, MaxTxn: 5}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ids := idsWhere(a, "")
	if !slices.Equal(ids, idsWhere(b, "")) {
		t.Fatalf("the two outboxes should hold the same ids")
	}
	var n, origins int
	e2e.WaitFor(t, time.Minute, func() bool {
		err := rec.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT origin) FROM effects`).Scan(&n, &origins)
		return err == nil && n >= 2*len(ids)
	})
	st := rec.c.Stats()
	t.Logf("two outboxes, ids %d-%d in each: %d events processed under %d origins (consumer: processed %d, duplicates %d) in %s",
		ids[0], ids[len(ids)-1], n, origins, st.Processed, st.Duplicates, time.Since(start).Round(time.Millisecond))
	if n != 2*len(ids) || origins != 2 || st.Processed != int64(2*len(ids)) || st.Duplicates != 0 {
		t.Fatalf("want %d events processed once each under 2 origins", 2*len(ids))
	}
}

// (d) The promotion of an asynchronous standby on 15 that stopped receiving
// before events committed on the old primary (and published from it): the
// new primary's timeline left the old one before the checkpoint. Its slot is
// gone with the old primary (no failover slots before 17): outboxd creates
// one and refuses the fork.
func TestAsyncStandbyPromotionRefusesThenResetDeliversEverything(t *testing.T) {
	t.Parallel()
	var standby *testenv.PGServer
	rewindCaseWith(t, "history forked", rewindSetup{snapshot: func(t *testing.T, srv *testenv.PGServer) string {
		standby = srv.StartStandby(testenv.UniqueName("phys"))
		catchUp(t, srv, standby)
		standby.Stop("fast")
		return ""
	}}, promote(t, &standby))
}

// catchUp waits until standby replayed what srv has written.
func catchUp(t *testing.T, srv, standby *testenv.PGServer) {
	t.Helper()
	c, err := pgx.Connect(context.Background(), srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var at string
	if err := c.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	e2e.WaitFor(t, time.Minute, func() bool {
		s, err := pgx.Connect(context.Background(), standby.DSN)
		if err != nil {
			return false
		}
		defer s.Close(context.Background())
		var ok bool
		return s.QueryRow(context.Background(), `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, at).Scan(&ok) == nil && ok
	})
}

// promote stops the primary, starts the standby, promotes it and points e at
// it.
func promote(t *testing.T, standbyp **testenv.PGServer) func(srv *testenv.PGServer, _, _ string, e *e2e.Env) {
	return func(srv *testenv.PGServer, _, _ string, e *e2e.Env) {
		standby := *standbyp
		srv.Stop("fast")
		standby.Start()
		u, err := url.Parse(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		e.DSN = e2e.WithDatabase(t, standby.DSN, strings.TrimPrefix(u.Path, "/"))
		e.Exec(`SELECT pg_promote()`)
		e2e.WaitFor(t, time.Minute, func() bool {
			c := e.Conn()
			defer c.Close(context.Background())
			var rec bool
			return c.QueryRow(context.Background(), `SELECT pg_is_in_recovery()`).Scan(&rec) == nil && !rec
		})
	}
}
