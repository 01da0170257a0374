package security

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/replication"
)

// TestRunForgedMessagesNeitherPublishedNorHalting: a role with no grants at
// all (PUBLIC may still execute pg_logical_emit_message, as when migrate
// could not revoke it) emits malformed content and content shaped like
// outbox_emit's, old and new format, with outboxd's prefix. outboxd stays
// up, publishes none of it and counts it; the table's rows before and after
// and a granted role's outbox_emit events arrive, in commit order.
func TestRunForgedMessagesNeitherPublishedNorHalting(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	intruder := e.LoginRole("nogrant")
	app := e.LoginRole("app", `GRANT EXECUTE ON FUNCTION outbox_emit(text, text, jsonb, jsonb) TO %s`)
	d, base := e.StartWithMetrics()
	d.WaitLog("streaming", 60*time.Second)
	ctx := context.Background()
	owner := e.Conn()
	defer owner.Close(ctx)
	insert := func(n int) {
		t.Helper()
		if _, err := owner.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, $2::jsonb)`, e.Topic, fmt.Sprintf(`{"row": %d}`, n)); err != nil {
			t.Fatal(err)
		}
	}
	fields := fmt.Sprintf(`%d:%s1:k2:{}{"forged": 1}`, len(e.Topic), e.Topic)
	forged := []string{
		"v1:garbage",
		"v1:" + fields,
		"v2:" + strings.Repeat("0", 64) + ":" + fields,
		"v2:" + fields,
		"v3:" + strings.Repeat("0", 64) + ":1:" + fields,
		"v9:anything",
	}
	insert(1)
	ic, err := pgx.Connect(ctx, intruder)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close(ctx)
	// Neither the no-grant role nor one granted outbox_emit can read the key.
	for _, dsn := range []string{intruder, app} {
		rc, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = rc.Exec(ctx, `SELECT key FROM outbox_emit_key`)
		rc.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("reading outbox_emit_key as a role without SELECT on it: err %v, want permission denied", err)
		}
	}
	for _, c := range forged {
		if _, err := ic.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::text)`, c); err != nil {
			t.Fatalf("the no-grant role could not emit (the test needs PUBLIC to hold EXECUTE): %v", err)
		}
	}
	// In one transaction with a real event and a forged one: the real one
	// still arrives.
	if _, err := ic.Exec(ctx, `SELECT pg_logical_emit_message(false, 'outboxd', $1::text)`, "v1:"+fields); err != nil {
		t.Fatal(err)
	}
	insert(2)
	ac, err := pgx.Connect(ctx, app)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close(ctx)
	if _, err := ac.Exec(ctx, `SELECT outbox_emit($1, 'k', '{"emitted": 3}')`, e.Topic); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, owner, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::text)`, "v1:"+fields); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT outbox_emit($1, 'k', '{"emitted": 4}')`, e.Topic)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	insert(5)
	got := testenv.Kafka(t).ReadAll(t, e.Topic, 5, 60*time.Second)
	var vs []string
	for _, m := range got {
		vs = append(vs, string(m.Value))
	}
	want := `{"row": 1} {"row": 2} {"emitted": 3} {"emitted": 4} {"row": 5}`
	if strings.Join(vs, " ") != want {
		t.Fatalf("records %q, want %s (nothing forged)", vs, want)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited:\n%s", d.Out.String())
	}
	var total float64
	for _, r := range []string{"bad_mac", "malformed", "unauthenticated_v1", "unbound_v2", "replayed", "unknown_format", "not_transactional"} {
		total += e2e.Scrape(t, base)[`outboxd_rejected_messages_total{reason="`+r+`"}`]
	}
	if total != float64(len(forged)+2) {
		t.Errorf("outboxd_rejected_messages_total sums to %v, want %d", total, len(forged)+2)
	}
	if !strings.Contains(d.Out.String(), "did not write") || !strings.Contains(d.Out.String(), `"xid"`) {
		t.Errorf("no warning with the LSN and xid of a skipped message:\n%s", d.Out.String())
	}
	d.Stop()
}

// TestMigrateRevokesEmitFromPublic: status warns while PUBLIC can execute
// pg_logical_emit_message; migrate (as a superuser) revokes it, after which
// a no-grant role cannot emit at all and the warning is gone.
func TestMigrateRevokesEmitFromPublic(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	intruder := e.LoginRole("nogrant")
	status := func() string {
		d := e2e.StartDaemon(t, "status", "--pg-dsn", e.DSN, "--slot", e.Slot, "--publication", e.Slot, "--allow-inactive")
		d.Wait(60 * time.Second)
		return d.Out.String()
	}
	if out := status(); !strings.Contains(out, "warning: PUBLIC can execute pg_logical_emit_message") {
		t.Fatalf("status before migrate: no warning about PUBLIC:\n%s", out)
	}
	m := e2e.StartDaemon(t, "migrate", "--pg-dsn", e.DSN)
	if code := m.Wait(60 * time.Second); code != 0 || !strings.Contains(m.Out.String(), "PUBLIC cannot execute pg_logical_emit_message") {
		t.Fatalf("migrate exited %d:\n%s", code, m.Out.String())
	}
	if out := status(); strings.Contains(out, "PUBLIC can execute") {
		t.Fatalf("status after migrate still warns:\n%s", out)
	}
	ic, err := pgx.Connect(context.Background(), intruder)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close(context.Background())
	if _, err := ic.Exec(context.Background(), `SELECT pg_logical_emit_message(true, 'outboxd', 'v1:garbage')`); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("no-grant role emitting after migrate: err %v, want permission denied", err)
	}
}

// TestRunUpgradeFromUnsignedMessages: a database migrated before 007 (an
// outbox_emit writing unsigned v1 messages, no key) stops outboxd with the
// fix; after "outboxd migrate" the v1 backlog written before the key was
// installed is published, a v1 message after it is not, and signed events
// are.
func TestRunUpgradeFromUnsignedMessages(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	old, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "migrations", "006_outbox_emit.sql"))
	if err != nil {
		t.Fatal(err)
	}
	e.Exec(`DROP TABLE outbox_emit_key; DELETE FROM outboxd_schema_migrations WHERE version IN ('007', '008', '009')`)
	e.Exec(string(old))
	d := e2e.StartDaemon(t, e.Args()...)
	if code := d.Wait(60 * time.Second); code == 0 || !strings.Contains(d.Out.String(), `without its MAC key`) ||
		!strings.Contains(d.Out.String(), `run \"outboxd migrate\"`) {
		t.Fatalf("outboxd on a pre-007 database exited %d, want a halt saying to run outboxd migrate:\n%s", code, d.Out.String())
	}
	ctx := context.Background()
	c := e.Conn()
	defer c.Close(ctx)
	emit := func(payload string) {
		t.Helper()
		if _, err := c.Exec(ctx, `SELECT outbox_emit($1, 'k', $2::jsonb)`, e.Topic, payload); err != nil {
			t.Fatal(err)
		}
	}
	emit(`{"backlog": 1}`) // the slot exists: the failed run created it
	m := e2e.StartDaemon(t, "migrate", "--pg-dsn", e.DSN)
	if code := m.Wait(60 * time.Second); code != 0 {
		t.Fatalf("migrate exited %d:\n%s", code, m.Out.String())
	}
	fields := fmt.Sprintf(`%d:%s1:k2:{}{"late": "v1"}`, len(e.Topic), e.Topic)
	if _, err := c.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::text)`, "v1:"+fields); err != nil {
		t.Fatal(err)
	}
	emit(`{"signed": 2}`)
	d = e.Start()
	got := e2e.Values(t, e, e.Topic, 2)
	if strings.Join(got, " ") != `{"backlog": 1} {"signed": 2}` {
		t.Fatalf("records %q, want the v1 backlog and the signed event, not the v1 message after the upgrade", got)
	}
	d.Stop()
}

// capture creates a pgoutput slot that sees what is written from now on,
// as anyone reading WAL does (an archive, a base backup, a slot peek), and
// returns a function giving the contents of the outboxd messages it holds.
func capture(e *e2e.Env) func() [][]byte {
	e.T.Helper()
	name := testenv.UniqueName("capture")
	e.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name)
	return func() [][]byte {
		e.T.Helper()
		c := e.Conn()
		defer c.Close(context.Background())
		rows, err := c.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, name, e.Slot)
		if err != nil {
			e.T.Fatal(err)
		}
		var out [][]byte
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				e.T.Fatal(err)
			}
			// 'M', flags, LSN, prefix\0, length, content.
			if len(b) < 10 || b[0] != 'M' {
				continue
			}
			prefix, rest, ok := bytes.Cut(b[10:], []byte{0})
			if ok && string(prefix) == replication.MessagePrefix && len(rest) >= 4 {
				out = append(out, bytes.Clone(rest[4:]))
			}
		}
		if err := rows.Err(); err != nil {
			e.T.Fatal(err)
		}
		return out
	}
}

// TestRunReplayedMessageNotPublished: a role with no grants at all takes a
// message outbox_emit signed (as anyone reading WAL sees it) and emits it
// again in a transaction of its own. outboxd publishes the original once,
// rejects the replay as "replayed" and goes on. With a MAC over the content
// alone the replay was published a second time, under a new outbox-id.
func TestRunReplayedMessageNotPublished(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	d, base := e.StartWithMetrics()
	d.WaitLog("streaming", 60*time.Second)
	captured := capture(e)
	ctx := context.Background()
	owner := e.Conn()
	defer owner.Close(ctx)
	if _, err := owner.Exec(ctx, `SELECT outbox_emit($1, 'k', '{"n": 1}')`, e.Topic); err != nil {
		t.Fatal(err)
	}
	msgs := captured()
	if len(msgs) != 1 {
		t.Fatalf("captured %q, want outbox_emit's one message", msgs)
	}
	ic, err := pgx.Connect(ctx, e.LoginRole("nogrant"))
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close(ctx)
	if _, err := ic.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::bytea)`, msgs[0]); err != nil {
		t.Fatalf("the no-grant role could not emit (the test needs PUBLIC to hold EXECUTE): %v", err)
	}
	if _, err := owner.Exec(ctx, `SELECT outbox_emit($1, 'k', '{"n": 2}')`, e.Topic); err != nil {
		t.Fatal(err)
	}
	if got := e2e.Values(t, e, e.Topic, 2); strings.Join(got, " ") != `{"n": 1} {"n": 2}` {
		t.Fatalf("records %q, want each event once and no replay", got)
	}
	if n := e2e.Scrape(t, base)[`outboxd_rejected_messages_total{reason="replayed"}`]; n != 1 {
		t.Errorf(`outboxd_rejected_messages_total{reason="replayed"} = %v, want 1`, n)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited:\n%s", d.Out.String())
	}
	d.Stop()
}

// TestRunUpgradeFromReplayableMessages: a database at migration 007 (an
// outbox_emit writing v2, MAC over the content only) stops outboxd with
// the fix; after "outboxd migrate" the v2 backlog is published, the same
// v2 content emitted again after the migration is not, and v3 events are.
func TestRunUpgradeFromReplayableMessages(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	v2 := func(name string) string {
		b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "migrations", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	e.Exec(`DROP TABLE outbox_emit_key; DROP FUNCTION outbox_emit_rotate_key(boolean); DROP FUNCTION outbox_emit_pad(bytea, integer);
		DELETE FROM outboxd_schema_migrations WHERE version IN ('008', '009')`)
	e.Exec(v2("006_outbox_emit.sql"))
	e.Exec(v2("007_outbox_emit_key.sql"))
	d := e2e.StartDaemon(t, e.Args()...)
	if code := d.Wait(60 * time.Second); code == 0 || !strings.Contains(d.Out.String(), `can replay`) ||
		!strings.Contains(d.Out.String(), `run \"outboxd migrate\"`) {
		t.Fatalf("outboxd on a database at 007 exited %d, want a halt saying to run outboxd migrate:\n%s", code, d.Out.String())
	}
	captured := capture(e)
	ctx := context.Background()
	c := e.Conn()
	defer c.Close(ctx)
	emit := func(payload string) {
		t.Helper()
		if _, err := c.Exec(ctx, `SELECT outbox_emit($1, 'k', $2::jsonb)`, e.Topic, payload); err != nil {
			t.Fatal(err)
		}
	}
	emit(`{"backlog": 1}`) // the slot exists: the failed run created it
	msgs := captured()
	if len(msgs) != 1 || !bytes.HasPrefix(msgs[0], []byte("v2:")) {
		t.Fatalf("captured %q, want one v2 message", msgs)
	}
	m := e2e.StartDaemon(t, "migrate", "--pg-dsn", e.DSN)
	if code := m.Wait(60 * time.Second); code != 0 {
		t.Fatalf("migrate exited %d:\n%s", code, m.Out.String())
	}
	if _, err := c.Exec(ctx, `SELECT pg_logical_emit_message(true, 'outboxd', $1::bytea)`, msgs[0]); err != nil {
		t.Fatal(err)
	}
	emit(`{"signed": 2}`)
	d = e.Start()
	if got := e2e.Values(t, e, e.Topic, 2); strings.Join(got, " ") != `{"backlog": 1} {"signed": 2}` {
		t.Fatalf("records %q, want the v2 backlog and the v3 event, not the v2 message replayed after the upgrade", got)
	}
	d.Stop()
}

// TestMigrateWarnsWhenSchemaDiffers: migrate installs into its connection's
// current schema and run reads outbox_emit's key from --schema by name, so
// migrate says so when the two differ (run would not find the key) and is
// quiet when they agree.
func TestMigrateWarnsWhenSchemaDiffers(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE SCHEMA events`)
	u, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "events") // pgx sends it as a run-time parameter
	u.RawQuery = q.Encode()
	m := e2e.StartDaemon(t, "migrate", "--pg-dsn", u.String())
	if code := m.Wait(60 * time.Second); code != 0 || !strings.Contains(m.Out.String(), `not --schema "public": pass --schema "events"`) {
		t.Fatalf("migrate into schema events, --schema public: exit %d, want the warning:\n%s", code, m.Out.String())
	}
	m = e2e.StartDaemon(t, "migrate", "--pg-dsn", u.String(), "--schema", "events")
	if code := m.Wait(60 * time.Second); code != 0 || strings.Contains(m.Out.String(), "warning: outbox_emit") {
		t.Fatalf("migrate into schema events, --schema events: exit %d, want no warning:\n%s", code, m.Out.String())
	}
}

// TestEmitKeyRotate: "outboxd emit-key rotate" promotes the staged key and
// keeps the old one as previous; --forget-old-keys replaces all of them.
func TestEmitKeyRotate(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	ctx := context.Background()
	if m := e2e.StartDaemon(t, "migrate", "--pg-dsn", pg.DSN); m.Wait(60*time.Second) != 0 {
		t.Fatalf("migrate:\n%s", m.Out.String())
	}
	keys := func() (key, next, previous []byte) {
		t.Helper()
		if err := conn.QueryRow(ctx, `SELECT key, next_key, previous_key FROM outbox_emit_key`).Scan(&key, &next, &previous); err != nil {
			t.Fatal(err)
		}
		return key, next, previous
	}
	k0, n0, _ := keys()
	if m := e2e.StartDaemon(t, "emit-key", "rotate", "--pg-dsn", pg.DSN); m.Wait(60*time.Second) != 0 {
		t.Fatalf("emit-key rotate:\n%s", m.Out.String())
	}
	k1, n1, p1 := keys()
	if !bytes.Equal(k1, n0) || !bytes.Equal(p1, k0) || bytes.Equal(n1, n0) {
		t.Fatalf("after rotate: key %x (staged was %x), previous %x (key was %x), next %x", k1, n0, p1, k0, n1)
	}
	if m := e2e.StartDaemon(t, "emit-key", "rotate", "--forget-old-keys", "--pg-dsn", pg.DSN); m.Wait(60*time.Second) != 0 {
		t.Fatalf("emit-key rotate --forget-old-keys:\n%s", m.Out.String())
	}
	k2, n2, p2 := keys()
	if bytes.Equal(k2, k1) || bytes.Equal(k2, n1) || bytes.Equal(n2, n1) || p2 != nil {
		t.Fatalf("after --forget-old-keys: key %x, next %x, previous %x; want all new, no previous", k2, n2, p2)
	}
}
