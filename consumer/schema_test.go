package consumer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

func TestSchemaSQLQuotesTheTable(t *testing.T) {
	t.Parallel()
	for table, want := range map[string]string{
		"processed_outbox_ids": `CREATE TABLE IF NOT EXISTS "processed_outbox_ids" (`,
		`Svc."Seen Ids"`:       `CREATE TABLE IF NOT EXISTS "Svc"."""Seen Ids""" (`,
	} {
		sql, err := SchemaSQL(table)
		if err != nil {
			t.Fatalf("SchemaSQL(%q): %v", table, err)
		}
		if !strings.HasPrefix(sql, want) {
			t.Errorf("SchemaSQL(%q) = %q, want it to start with %q", table, sql, want)
		}
	}
	if _, err := SchemaSQL("a.b.c"); err == nil || err.Error() != `consumer: dedup table "a.b.c": want table or schema.table` {
		t.Fatalf("SchemaSQL(a.b.c): %v", err)
	}
}

// Migrate creates the table Config.DedupTable names, concurrently and again
// without error, and a consumer store works on it.
func TestMigrateCustomTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE SCHEMA "Svc"`)
	const table = "Svc.Seen Ids"
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		conn := pg.Conn(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = Migrate(ctx, conn, table)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	conn := pg.Conn(t)
	if err := Migrate(ctx, conn, table); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	st, err := newPGStore(conn, table)
	if err != nil {
		t.Fatal(err)
	}
	m := &Message{OutboxID: 7, Topic: "t"}
	for _, wantDup := range []bool{false, true} {
		dup, err := st.attempt(ctx, m, HandlerFunc(func(context.Context, pgx.Tx, *Message) error { return nil }))
		if err != nil || dup != wantDup {
			t.Fatalf("attempt: dup %v, err %v; want dup %v", dup, err, wantDup)
		}
	}
	var dups int
	if err := conn.QueryRow(ctx, `SELECT duplicates FROM "Svc"."Seen Ids" WHERE outbox_id = 7`).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	if dups != 1 {
		t.Fatalf("duplicates = %d, want 1", dups)
	}
	missing, err := newPGStore(conn, "missing_ids")
	if err != nil {
		t.Fatal(err)
	}
	_, err = missing.attempt(ctx, m, HandlerFunc(func(context.Context, pgx.Tx, *Message) error { return nil }))
	var dbErr *dbError
	if !errors.As(err, &dbErr) || !strings.Contains(err.Error(), "dedup table missing_ids missing: create it with consumer.Migrate") {
		t.Fatalf("attempt without the dedup table: %v, want a database error saying how to create it", err)
	}
	if err := Migrate(ctx, conn, "NoSuchSchema.t"); err == nil || !strings.Contains(err.Error(), "consumer: create dedup table NoSuchSchema.t: ") {
		t.Fatalf("Migrate into a missing schema: %v", err)
	}
}
