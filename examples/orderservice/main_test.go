package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/examples/internal/brew"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

func migrated(t *testing.T) (*testenv.PG, *pgx.Conn) {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := brew.Migrate(context.Background(), conn, nil); err != nil {
		t.Fatalf("brew.Migrate: %v", err)
	}
	return pg, conn
}

func count(t *testing.T, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestCreateOrderWritesOrderAndEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, conn := migrated(t)
	if err := run(ctx, []string{"--pg-dsn", pg.DSN, "--count", "3"}); err != nil {
		t.Fatalf("run: %v", err)
	}
	rows, _ := conn.Query(ctx, `SELECT o.id, o.aggregate_id, o.topic, o.payload::text, r.customer, r.amount::text
		FROM outbox o JOIN orders r ON o.aggregate_id = 'order-' || r.id ORDER BY o.id`)
	type pair struct {
		id                            int64
		agg, topic, payload, customer string
		amount                        string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pair, error) {
		var p pair
		err := r.Scan(&p.id, &p.agg, &p.topic, &p.payload, &p.customer, &p.amount)
		return p, err
	})
	if err != nil || len(got) != 3 {
		t.Fatalf("%d order/event pairs (err %v), want 3", len(got), err)
	}
	for _, p := range got {
		var ev brew.OrderCreated
		if err := json.Unmarshal([]byte(p.payload), &ev); err != nil {
			t.Fatalf("payload %s: %v", p.payload, err)
		}
		if p.topic != brew.OrdersTopic || p.agg != brew.AggregateID(ev.ID) || ev.Type != brew.TypeOrderCreated ||
			ev.Customer != p.customer || ev.Amount != p.amount || ev.Status != brew.StatusCreated {
			t.Errorf("row %+v: event %+v does not match its order", p, ev)
		}
	}
}

// If the outbox insert fails, the order is rolled back with it.
func TestCreateOrderIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, conn := migrated(t)
	pg.Exec(t, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'outbox refused'; END $$`)
	pg.Exec(t, `CREATE TRIGGER refuse BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`)
	if _, _, err := createOrder(ctx, conn, insertRow, brew.OrdersTopic, "c", 100); err == nil {
		t.Fatal("createOrder succeeded with the outbox refusing inserts")
	}
	if n := count(t, conn, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders after a failed outbox insert, want 0", n)
	}
	pg.Exec(t, `DROP TRIGGER refuse ON outbox`)
	if _, _, err := createOrder(ctx, conn, insertRow, brew.OrdersTopic, "c", 100); err != nil {
		t.Fatalf("createOrder: %v", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}

func TestSetStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, conn := migrated(t)
	id, _, err := createOrder(ctx, conn, insertRow, brew.OrdersTopic, "c", 100)
	if err != nil {
		t.Fatal(err)
	}
	prev, _, err := setStatus(ctx, conn, insertRow, brew.StatusTopic, id, brew.StatusCompleted) // not judged here
	if err != nil || prev != brew.StatusCreated {
		t.Fatalf("setStatus: prev %q, err %v", prev, err)
	}
	var payload, topic string
	if err := conn.QueryRow(ctx, `SELECT payload::text, topic FROM outbox ORDER BY id DESC LIMIT 1`).Scan(&payload, &topic); err != nil {
		t.Fatal(err)
	}
	var ev brew.StatusChanged
	if err := json.Unmarshal([]byte(payload), &ev); err != nil || topic != brew.StatusTopic ||
		ev != (brew.StatusChanged{Type: brew.TypeStatusChanged, ID: id, Status: brew.StatusCompleted}) {
		t.Fatalf("event %s on %s (%v)", payload, topic, err)
	}
	if _, _, err := setStatus(ctx, conn, insertRow, brew.StatusTopic, id+1000, brew.StatusAccepted); !errors.Is(err, errNoOrder) {
		t.Fatalf("unknown order: err %v, want errNoOrder", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d outbox rows, want 2 (none for the unknown order)", n)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	var s statusChanges
	for _, bad := range []string{"7", "x=accepted", "0=accepted", "7=teleported"} {
		if err := s.Set(bad); err == nil {
			t.Errorf("--set-status %s accepted", bad)
		}
	}
	if err := s.Set(" 7 = accepted "); err != nil || len(s) != 1 || s[0] != (statusChange{7, brew.StatusAccepted}) {
		t.Fatalf("--set-status: %v %v", s, err)
	}
	if err := run(context.Background(), []string{"--pg-dsn", "postgres://x"}); err == nil {
		t.Fatal("run without work succeeded")
	}
}

// TestEmitWritesNoRowAndRollsBackWithTheOrder: with --emit the event is a
// WAL message (outbox_emit), so no outbox row is written, and it shares the
// order's transaction: a failed order emits nothing (its LSN would never be
// decoded: outboxd's tests check rolled-back messages are not published).
func TestEmitWritesNoRowAndRollsBackWithTheOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, conn := migrated(t)
	if err := run(ctx, []string{"--pg-dsn", pg.DSN, "--count", "2", "--emit", "--set-status", "1=accepted"}); err != nil {
		t.Fatalf("run --emit: %v", err)
	}
	if n := count(t, conn, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d outbox rows with --emit, want 0", n)
	}
	if n := count(t, conn, `SELECT count(*) FROM orders WHERE status = 'accepted'`); n != 1 {
		t.Fatalf("%d accepted orders, want 1", n)
	}
	_, id, err := createOrder(ctx, conn, emitMessage, brew.OrdersTopic, "c", 100)
	if err != nil || id <= 0 {
		t.Fatalf("createOrder with emitMessage: outbox id %d, %v; want its LSN", id, err)
	}
}
