package retention

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// withOldRows is a migrated database holding old outbox rows created two
// hours ago.
func withOldRows(t *testing.T, old int) (*testenv.PG, *pgx.Conn) {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload, created_at)
		SELECT 'a', 't', '{}', now() - interval '2 hours' FROM generate_series(1, $1)`, old)
	return pg, conn
}

func TestPruneDeletesOnlyOldRowsInBatches(t *testing.T) {
	t.Parallel()
	pg, conn := withOldRows(t, 25)
	ctx := context.Background()
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 5)`)
	cfg := DefaultConfig()
	cfg.OlderThan, cfg.BatchSize = time.Hour, 7 // four statements: 7, 7, 7, 4
	n, err := Prune(ctx, conn, cfg)
	if err != nil || n != 25 {
		t.Fatalf("Prune = %d, %v; want the 25 old rows", n, err)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 5 {
		t.Fatalf("%d rows left (%v), want the 5 new ones", left, err)
	}

	// The polling source's table: only published rows go.
	pg.Exec(t, `ALTER TABLE outbox ADD COLUMN published_at timestamptz`)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload, created_at, published_at)
		SELECT 'a', 't', '{}', now() - interval '2 hours', CASE WHEN g % 2 = 0 THEN now() END FROM generate_series(1, 10) AS g`)
	cfg.PublishedOnly = true
	if n, err := Prune(ctx, conn, cfg); err != nil || n != 5 {
		t.Fatalf("Prune(published only) = %d, %v; want the 5 published old rows", n, err)
	}
}

// A prune is not cut at the interval: with an interval shorter than a
// connection takes, every prune failed (and a DELETE the server committed
// meanwhile was neither logged nor counted).
func TestPrunerWithAShortIntervalStillPrunes(t *testing.T) {
	t.Parallel()
	pg, conn := withOldRows(t, 10)
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.OlderThan, cfg.Interval = time.Hour, time.Microsecond
	p, err := NewPruner(cfg, pg.DSN, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.once(ctx); err != nil {
		t.Fatalf("a prune with a 1 µs interval: %v", err)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left (%v), want none", left, err)
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err == nil {
		t.Fatal("a zero retention is valid")
	}
	c.OlderThan = time.Hour
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
