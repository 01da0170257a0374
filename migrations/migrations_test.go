package migrations

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/outboxd/outboxd/internal/testenv"
	"go.uber.org/zap/zaptest"
)

func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	logger := zaptest.NewLogger(t)

	applied, err := Apply(ctx, conn, logger)
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	if want := embedded(t); !slices.Equal(applied, want) {
		t.Fatalf("first Apply applied %q, want %q", applied, want)
	}
	applied, err = Apply(ctx, conn, logger)
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if len(applied) != 0 {
		t.Fatalf("second Apply applied %q, want nothing", applied)
	}

	var versions []string
	rows, err := conn.Query(ctx, `SELECT version FROM outboxd_schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		versions = append(versions, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range embeddedMigrations(t) {
		want = append(want, m.version)
	}
	slices.Sort(want) // the query orders versions as text
	if !slices.Equal(versions, want) {
		t.Fatalf("recorded versions %q, want %q", versions, want)
	}

	cols := map[string]string{}
	rows, err = conn.Query(ctx, `
SELECT column_name, data_type || ':' || is_nullable
FROM information_schema.columns
WHERE table_schema = 'public' AND table_name = 'outbox'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, desc string
		if err := rows.Scan(&name, &desc); err != nil {
			t.Fatal(err)
		}
		cols[name] = desc
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantCols := map[string]string{
		"id":           "bigint:NO",
		"aggregate_id": "text:NO",
		"topic":        "text:NO",
		"payload":      "jsonb:NO",
		"created_at":   "timestamp with time zone:NO",
		"headers":      "jsonb:YES",
	}
	if len(cols) != len(wantCols) {
		t.Errorf("outbox has columns %v, want %v", cols, wantCols)
	}
	for name, desc := range wantCols {
		if cols[name] != desc {
			t.Errorf("column %s is %q, want %q", name, cols[name], desc)
		}
	}

	// The table is usable as the daemon expects: defaults fill id and created_at.
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('a', 't', '{}') RETURNING id`).Scan(&id); err != nil {
		t.Fatalf("insert into outbox: %v", err)
	}
}

// Concurrent runs serialize on the advisory lock: exactly one applies.
func TestApplyConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	const n = 4
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total []string
		errs  []error
	)
	for i := 0; i < n; i++ {
		conn := pg.Conn(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied, err := Apply(ctx, conn, nil)
			mu.Lock()
			defer mu.Unlock()
			total = append(total, applied...)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) != 0 {
		t.Fatalf("concurrent Apply failed: %v", errs)
	}
	// Runs may split the files between them; together they apply each once.
	slices.Sort(total)
	if want := embedded(t); !slices.Equal(total, want) {
		t.Fatalf("concurrent runs applied %q in total, want %q once", total, want)
	}
}

// A failing migration is rolled back and not recorded; the ones before it stay.
func TestApplyStopsAtFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	fsys := fstest.MapFS{
		"1_a.sql": {Data: []byte(`CREATE TABLE a (x int)`)},
		"2_b.sql": {Data: []byte(`CREATE TABLE b (x int); SELECT 1/0`)},
		"3_c.sql": {Data: []byte(`CREATE TABLE c (x int)`)},
	}
	applied, err := ApplyFS(ctx, conn, nil, fsys, "test_schema_migrations")
	if err == nil || !strings.Contains(err.Error(), "apply 2_b.sql") {
		t.Fatalf("apply: err = %v, want the failure of 2_b.sql", err)
	}
	if want := []string{"1_a.sql"}; !slices.Equal(applied, want) {
		t.Fatalf("applied %q, want %q", applied, want)
	}
	var b, c bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('b') IS NOT NULL, to_regclass('c') IS NOT NULL`).Scan(&b, &c); err != nil {
		t.Fatal(err)
	}
	if b || c {
		t.Fatalf("tables b, c exist = %v, %v; want neither", b, c)
	}
	var versions int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM test_schema_migrations`).Scan(&versions); err != nil {
		t.Fatal(err)
	}
	if versions != 1 {
		t.Fatalf("%d versions recorded, want 1", versions)
	}
}

// Each owner's versions live in its own table: the same numbers in two sets
// both apply, and a version table name is quoted.
func TestApplyFSOwnVersionTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	a := fstest.MapFS{"001_a.sql": {Data: []byte(`CREATE TABLE a (x int)`)}}
	b := fstest.MapFS{"001_b.sql": {Data: []byte(`CREATE TABLE b (x int)`)}}
	for _, run := range []struct {
		fsys  fstest.MapFS
		table string
		want  []string
	}{
		{a, "Owner A", []string{"001_a.sql"}},
		{b, "owner_b", []string{"001_b.sql"}},
		{a, "Owner A", nil},
	} {
		applied, err := ApplyFS(ctx, conn, nil, run.fsys, run.table)
		if err != nil {
			t.Fatalf("ApplyFS into %q: %v", run.table, err)
		}
		if !slices.Equal(applied, run.want) {
			t.Fatalf("ApplyFS into %q applied %q, want %q", run.table, applied, run.want)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM "Owner A") + (SELECT count(*) FROM owner_b)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d versions recorded, want one per owner", n)
	}
	if _, err := ApplyFS(ctx, conn, nil, a, ""); err == nil {
		t.Fatal("ApplyFS without a version table succeeded")
	}
}

// A database migrated before the examples', the consumer's and the poller's
// schema moved to their owners has versions 001 to 004 recorded and their
// tables: Apply applies only outboxd's newer files (005 on), fails on
// nothing and drops nothing.
func TestApplyOnDatabaseMigratedWithRetiredVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	pg.Exec(t, `CREATE TABLE outboxd_schema_migrations (version text PRIMARY KEY, applied_at timestamptz DEFAULT now())`)
	pg.Exec(t, `INSERT INTO outboxd_schema_migrations (version) VALUES ('001'), ('002'), ('003'), ('004')`)
	pg.Exec(t, `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, topic text NOT NULL,
		payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz)`)
	pg.Exec(t, `CREATE INDEX outbox_unpublished_id_idx ON outbox (id) WHERE published_at IS NULL`)
	pg.Exec(t, `CREATE TABLE orders (id bigserial PRIMARY KEY)`)
	pg.Exec(t, `CREATE TABLE processed_outbox_ids (outbox_id bigint PRIMARY KEY)`)
	pg.Exec(t, `CREATE TABLE order_status (order_id bigint PRIMARY KEY)`)
	applied, err := Apply(ctx, conn, nil)
	if want := []string{"005_outbox_headers.sql", "006_outbox_emit.sql", "007_outbox_emit_key.sql", "008_outbox_emit_headers.sql", "009_outbox_emit_xid.sql"}; err != nil || !slices.Equal(applied, want) {
		t.Fatalf("Apply: applied %q, err %v; want only %q", applied, err, want)
	}
	var all bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('orders') IS NOT NULL AND to_regclass('processed_outbox_ids') IS NOT NULL
		AND to_regclass('order_status') IS NOT NULL AND to_regclass('outbox_unpublished_id_idx') IS NOT NULL`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if !all {
		t.Fatal("a table or index of the retired migrations is gone")
	}
}

func TestLoadOrder(t *testing.T) {
	t.Parallel()
	ms, err := load(fstest.MapFS{
		"10_ten.sql":  {Data: []byte("10")},
		"2_two.sql":   {Data: []byte("2")},
		"001_one.sql": {Data: []byte("1")},
		"README.md":   {Data: []byte("not a migration")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.version+"="+m.name)
	}
	if want := []string{"001=001_one.sql", "2=2_two.sql", "10=10_ten.sql"}; !slices.Equal(got, want) {
		t.Fatalf("order %q, want %q", got, want)
	}
}

func TestLoadRejectsAmbiguousNames(t *testing.T) {
	t.Parallel()
	for name, fsys := range map[string]fstest.MapFS{
		"duplicate number": {"1_a.sql": {}, "001_b.sql": {}},
		"no number":        {"outbox.sql": {}},
		"signed number":    {"+1_a.sql": {}},
		"no files":         {},
	} {
		if _, err := load(fsys); err == nil {
			t.Errorf("%s: load succeeded, want an error", name)
		}
	}
}

func TestEmbeddedFilesLoad(t *testing.T) {
	t.Parallel()
	ms, err := load(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || ms[0].name != "001_outbox.sql" {
		t.Fatalf("embedded migrations %v, want 001_outbox.sql first", ms)
	}
	// 002 to 004 are recorded on databases migrated before the examples',
	// the consumer's and the poller's schema moved to their owners: a new
	// migration under one of these numbers would be skipped there.
	for _, m := range ms {
		if m.num >= 2 && m.num <= 4 {
			t.Errorf("migration %s uses retired version %d: number it 005 or later", m.name, m.num)
		}
	}
}

// embeddedMigrations returns the embedded migrations in order, so the tests
// above need no update when a migration is added.
func embeddedMigrations(t *testing.T) []migration {
	t.Helper()
	ms, err := load(files)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// embedded returns the embedded migration file names in order.
func embedded(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, m := range embeddedMigrations(t) {
		names = append(names, m.name)
	}
	return names
}
