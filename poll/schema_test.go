package poll

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

func partialIndexes(t *testing.T, conn *pgx.Conn, qualified string) []string {
	t.Helper()
	rows, _ := conn.Query(context.Background(), `
		SELECT indexrelid::regclass::text FROM pg_index
		 WHERE indrelid = to_regclass($1) AND pg_get_expr(indpred, indrelid) ILIKE '%published_at IS NULL%'
		 ORDER BY 1`, qualified)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// Migrate adds the column and the index to the outbox of "outboxd migrate",
// once; the table is then pollable with the index.
func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		t.Fatal(err)
	}
	created, err := Migrate(ctx, conn, "public", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"column public.outbox.published_at", "index public.outbox_unpublished_id_idx"}; !slices.Equal(created, want) {
		t.Fatalf("Migrate created %q, want %q", created, want)
	}
	if created, err = Migrate(ctx, conn, "public", "outbox"); err != nil || len(created) != 0 {
		t.Fatalf("second Migrate: created %q, err %v; want nothing", created, err)
	}
	if got := partialIndexes(t, conn, "outbox"); !slices.Equal(got, []string{"outbox_unpublished_id_idx"}) {
		t.Fatalf("partial indexes %q", got)
	}
	tbl, err := inspect(ctx, conn, DefaultConfig())
	if err != nil {
		t.Fatalf("inspect after Migrate: %v", err)
	}
	if !tbl.hasIndex {
		t.Fatal("inspect finds no partial index after Migrate")
	}
}

// A database migrated by outboxd before the poller's schema moved here ran
// migration 004 (column and index): Migrate finds both and creates nothing,
// and so does it when the index was created CONCURRENTLY under another name.
func TestMigrateKeepsExistingSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, index := range map[string]string{
		"migration 004": `CREATE INDEX IF NOT EXISTS outbox_unpublished_id_idx ON outbox (id) WHERE published_at IS NULL`,
		"own index":     `CREATE INDEX CONCURRENTLY pending_rows ON outbox (id) WHERE published_at IS NULL`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t)
			conn := pg.Conn(t)
			if _, err := migrations.Apply(ctx, conn, nil); err != nil {
				t.Fatal(err)
			}
			pg.Exec(t, `ALTER TABLE outbox ADD COLUMN IF NOT EXISTS published_at timestamptz`)
			pg.Exec(t, index)
			before := partialIndexes(t, conn, "outbox")
			created, err := Migrate(ctx, conn, "public", "outbox")
			if err != nil || len(created) != 0 {
				t.Fatalf("Migrate: created %q, err %v; want nothing", created, err)
			}
			if after := partialIndexes(t, conn, "outbox"); !slices.Equal(after, before) {
				t.Fatalf("partial indexes %q, want %q", after, before)
			}
		})
	}
}

// The configured table is migrated, its names quoted.
func TestMigrateCustomTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	pg.Exec(t, `CREATE SCHEMA "Events"; CREATE TABLE "Events"."My Outbox" (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, topic text, payload jsonb NOT NULL)`)
	created, err := Migrate(ctx, conn, "Events", "My Outbox")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"column Events.My Outbox.published_at", "index Events.My Outbox_unpublished_id_idx"}; !slices.Equal(created, want) {
		t.Fatalf("Migrate created %q, want %q", created, want)
	}
	cfg := DefaultConfig()
	cfg.Schema, cfg.Table = "Events", "My Outbox"
	if tbl, err := inspect(ctx, conn, cfg); err != nil || !tbl.hasIndex {
		t.Fatalf("inspect: %v (index found: %v)", err, err == nil && tbl.hasIndex)
	}
}

func TestMigrateNoTable(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	_, err := Migrate(context.Background(), pg.Conn(t), "public", "outbox")
	want := `outbox table public.outbox does not exist: create it first ("outboxd migrate" creates public.outbox)`
	if !errors.Is(err, ErrSchema) || err.Error() != want {
		t.Fatalf("Migrate: %v, want %q", err, want)
	}
}

// Concurrent runs serialize on the migrations' advisory lock: together they
// create the column and the index once.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	if _, err := migrations.Apply(ctx, pg.Conn(t), nil); err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total []string
		errs  []error
	)
	for range 4 {
		conn := pg.Conn(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			created, err := Migrate(ctx, conn, "public", "outbox")
			mu.Lock()
			defer mu.Unlock()
			total = append(total, created...)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if len(errs) != 0 {
		t.Fatalf("concurrent Migrate: %v", errs)
	}
	slices.Sort(total)
	if want := []string{"column public.outbox.published_at", "index public.outbox_unpublished_id_idx"}; !slices.Equal(total, want) {
		t.Fatalf("concurrent runs created %q, want %q once", total, want)
	}
}
