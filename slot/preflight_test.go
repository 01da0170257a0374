package slot

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

func TestPreflightOK(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newDB(t)
	if err := Preflight(ctx, conn, cfg, true); err != nil {
		t.Fatalf("Preflight before Ensure: %v", err)
	}
	if _, err := Ensure(ctx, conn, cfg, true); err != nil {
		t.Fatal(err)
	}
	if err := Preflight(ctx, conn, cfg, true); err != nil {
		t.Fatalf("Preflight after Ensure: %v", err)
	}
}

func TestPreflightInvalidConfig(t *testing.T) {
	t.Parallel()
	// Validation comes first: no query runs, so no connection is needed.
	cfg := DefaultConfig()
	cfg.Slot = "Bad"
	err := Preflight(context.Background(), nil, cfg, true)
	if err == nil || err.Error() != `invalid slot configuration: Slot "Bad" is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores ([a-z_][a-z0-9_]*)` {
		t.Fatalf("Preflight = %v", err)
	}
}

// wal_level needs a server of its own: the setting takes a restart.
func TestPreflightWALLevel(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	srv := testenv.StartPostgres(t)
	conn, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, conn, `ALTER SYSTEM SET wal_level = replica`)
	conn.Close(ctx)
	srv.Restart("fast")

	conn, err = pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	wantError(t, Preflight(ctx, conn, cfg, true),
		`wal_level is "replica", outboxd needs "logical": set wal_level = logical in postgresql.conf and restart PostgreSQL`,
		ErrWALLevel)
	// Ensure checks wal_level before it creates anything.
	created, err := Ensure(ctx, conn, cfg, true)
	wantError(t, err,
		`wal_level is "replica", outboxd needs "logical": set wal_level = logical in postgresql.conf and restart PostgreSQL`,
		ErrWALLevel)
	if len(created) != 0 {
		t.Errorf("Ensure created %q, want nothing", created)
	}
	var pubs int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_publication`).Scan(&pubs); err != nil || pubs != 0 {
		t.Errorf("%d publications (err %v), want none", pubs, err)
	}
}

func TestPreflightTableMissing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newEmptyDB(t)
	wantError(t, Preflight(ctx, conn, cfg, true),
		`outbox table public.outbox does not exist: run "outboxd migrate" or create it`,
		ErrTableMissing)

	cfg.Schema, cfg.Table = "events", "my_outbox"
	wantError(t, Preflight(ctx, conn, cfg, true),
		`outbox table events.my_outbox does not exist: run "outboxd migrate" or create it`,
		ErrTableMissing)

	_, err := Ensure(ctx, conn, cfg, true)
	wantError(t, err,
		`outbox table events.my_outbox does not exist: run "outboxd migrate" or create it`,
		ErrTableMissing)
}

func TestPreflightNotATable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newEmptyDB(t)
	mustExec(t, conn, `CREATE VIEW outbox AS SELECT 1::bigint AS id, 'a'::text AS aggregate_id, 't'::text AS topic, '{}'::jsonb AS payload`)
	wantError(t, Preflight(ctx, conn, cfg, true),
		`outbox table public.outbox is a view, not a table: outboxd publishes inserts into a table; run "outboxd migrate" with another --table or create one`,
		ErrTableMissing)
}

func TestPreflightColumnMissing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newEmptyDB(t)
	mustExec(t, conn, `CREATE TABLE outbox (id bigserial PRIMARY KEY, payload jsonb NOT NULL)`)
	wantError(t, Preflight(ctx, conn, cfg, true),
		`outbox table public.outbox has no column "aggregate_id" (the key): add it (see migrations/001_outbox.sql) or map another column`,
		ErrColumnMissing)

	mustExec(t, conn, `ALTER TABLE outbox ADD COLUMN aggregate_id text NOT NULL`)
	wantError(t, Preflight(ctx, conn, cfg, true),
		`outbox table public.outbox has no column "topic" (the topic): add it (see migrations/001_outbox.sql) or map another column, set a topic template or configure a default topic`,
		ErrColumnMissing)
	// With a default topic the column is optional.
	if err := Preflight(ctx, conn, cfg, false); err != nil {
		t.Fatalf("Preflight(requireTopic=false) = %v", err)
	}

	// A dropped column does not count.
	mustExec(t, conn, `ALTER TABLE outbox ADD COLUMN topic text, DROP COLUMN payload`)
	wantError(t, Preflight(ctx, conn, cfg, false),
		`outbox table public.outbox has no column "payload" (the payload): add it (see migrations/001_outbox.sql) or map another column`,
		ErrColumnMissing)
}

func TestPreflightNoReplicationRole(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pg, admin, cfg := newDB(t)

	role := testenv.UniqueName("alice")
	mustExec(t, admin, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'secret' NOREPLICATION`, role))
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), pg.DSN)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), `DROP ROLE IF EXISTS `+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	connCfg, err := pgx.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	connCfg.User, connCfg.Password = role, "secret"
	conn, err := pgx.ConnectConfig(ctx, connCfg)
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	defer conn.Close(ctx)

	want := fmt.Sprintf(`role %q lacks the REPLICATION attribute: ALTER ROLE %s REPLICATION (or use a role that has it)`, role, role)
	wantError(t, Preflight(ctx, conn, cfg, true), want, ErrNoReplicationRole)

	// Ensure says the same before it creates anything.
	created, err := Ensure(ctx, conn, cfg, true)
	wantError(t, err, want, ErrNoReplicationRole)
	if len(created) != 0 || publicationExists(t, admin, cfg.Publication) {
		t.Errorf("Ensure created %q, want nothing", created)
	}

	// The fix the message gives works.
	mustExec(t, admin, fmt.Sprintf(`ALTER ROLE %s REPLICATION`, role))
	if err := Preflight(ctx, conn, cfg, true); err != nil {
		t.Fatalf("Preflight after ALTER ROLE ... REPLICATION: %v", err)
	}
}

func TestPreflightSlotPlugin(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newDB(t)
	mustExec(t, conn, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, cfg.Slot)
	want := fmt.Sprintf(`replication slot %q uses plugin "test_decoding", outboxd needs "pgoutput": drop it with "outboxd slot drop" or choose another --slot`, cfg.Slot)
	wantError(t, Preflight(ctx, conn, cfg, true), want, ErrSlotPlugin)
	_, err := Ensure(ctx, conn, cfg, true)
	wantError(t, err, want, ErrSlotPlugin)

	// The fix the message gives works.
	if err := Drop(ctx, conn, cfg, false); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(ctx, conn, cfg, true); err != nil {
		t.Fatal(err)
	}
	if err := Preflight(ctx, conn, cfg, true); err != nil {
		t.Fatal(err)
	}
}

func TestPreflightPhysicalSlot(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newDB(t)
	mustExec(t, conn, `SELECT pg_create_physical_replication_slot($1)`, cfg.Slot)
	t.Cleanup(func() { _ = Drop(context.Background(), conn, cfg, false) }) // physical slots belong to no database
	wantError(t, Preflight(ctx, conn, cfg, true),
		fmt.Sprintf(`replication slot %q is a physical slot, outboxd needs a logical "pgoutput" slot: drop it with "outboxd slot drop" or choose another --slot`, cfg.Slot),
		ErrSlotPlugin)
	_, err := ConfirmedFlushLSN(ctx, conn, cfg.Slot)
	wantError(t, err,
		fmt.Sprintf(`replication slot %q is a physical slot, outboxd needs a logical "pgoutput" slot: drop it with "outboxd slot drop" or choose another --slot`, cfg.Slot),
		ErrSlotPlugin)
	if err := Drop(ctx, conn, cfg, false); err != nil {
		t.Fatalf("Drop of a physical slot: %v", err)
	}
	if slotExists(t, conn, cfg.Slot) {
		t.Fatal("slot still exists after Drop")
	}
}

func TestPreflightSlotOfAnotherDatabase(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pg, conn, cfg := newDB(t)
	other, otherConn, _ := newDB(t)
	otherCfg := cfg
	if _, err := Ensure(ctx, otherConn, otherCfg, true); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`replication slot %q belongs to database %q, outboxd is connected to %q: choose another --slot (slot names are cluster-wide) or connect to %q`,
		cfg.Slot, other.Database, pg.Database, other.Database)
	wantError(t, Preflight(ctx, conn, cfg, true), want, ErrSlotPlugin)
	_, err := Ensure(ctx, conn, cfg, true)
	wantError(t, err, want, ErrSlotPlugin)

	// Drop from here refuses: the slot may serve another deployment.
	wantError(t, Drop(ctx, conn, cfg, true),
		fmt.Sprintf(`replication slot %q belongs to database %q, not %q, and may serve another deployment: connect to %q to drop it, or choose another --slot`,
			cfg.Slot, other.Database, pg.Database, other.Database),
		ErrSlotPlugin)
	if !slotExists(t, conn, cfg.Slot) {
		t.Fatal("Drop dropped the other database's slot")
	}
	if err := Drop(ctx, otherConn, otherCfg, true); err != nil {
		t.Fatalf("Drop from the slot's own database: %v", err)
	}
}

// TestPreflightTablelessNamesTheSchema: outbox_emit is looked up in
// cfg.Schema by name, so a session whose search_path misses that schema
// still passes, and one of another schema fails with the schema named.
func TestPreflightTablelessNamesTheSchema(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newDB(t)
	cfg.Tableless = true
	mustExec(t, conn, `SET search_path = pg_catalog`)
	if err := Preflight(ctx, conn, cfg, false); err != nil {
		t.Fatalf("Preflight with public off the search_path: %v", err)
	}
	mustExec(t, conn, `CREATE SCHEMA other`)
	cfg.Schema = "other"
	if err := Preflight(ctx, conn, cfg, false); !errors.Is(err, ErrTablelessUnsupported) || !strings.Contains(err.Error(), `"other".outbox_emit`) {
		t.Fatalf("Preflight for schema other: %v, want ErrTablelessUnsupported naming other.outbox_emit", err)
	}
}
