package poll

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestNoticesRowsDeletedBeforeTheyWerePublished: rows inserted and deleted
// in one transaction never reach the poller; it counts them from the
// table's statistics and warns, while rolled-back inserts and a cleanup of
// published rows are not counted.
func TestNoticesRowsDeletedBeforeTheyWerePublished(t *testing.T) {
	pg := migrated(t)
	cfg := testConfig(pg)
	cfg.DeletedUnpublishedCheck = 1500 * time.Millisecond // above a busy backend's statistics delay
	core, logs := observer.New(zap.WarnLevel)
	p, err := New(cfg, zap.New(core), nil, Deps{NewProducer: fakeFactory(newFakeProducer(0, nil))})
	if err != nil {
		t.Fatal(err)
	}
	checks := make(chan int64, 100)
	p.unseen.onCheck = func(bound int64) { checks <- bound }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// nextCheck waits for the next comparison; the baseline (the first
	// check) reports nothing.
	nextCheck := func() int64 {
		t.Helper()
		select {
		case b := <-checks:
			return b
		case <-time.After(30 * time.Second):
			t.Fatal("no statistics check within 30s")
			return 0
		}
	}
	conn := pg.Conn(t)
	flush := func() { // this backend's statistics now, not within a second
		t.Helper()
		if _, err := conn.Exec(context.Background(), `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
	}
	nextCheck() // past the baseline

	// Not counted: published rows deleted by a cleanup, rolled-back inserts.
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 10)`)
	waitCount(t, pg, "published_at IS NOT NULL", 10, 30*time.Second)
	if _, err := conn.Exec(context.Background(), `DELETE FROM outbox WHERE published_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	flush()
	nextCheck()
	if b := nextCheck(); b != 0 {
		t.Fatalf("after a cleanup of published rows and a rollback the bound is %d, want 0", b)
	}

	// Counted: four rows inserted and deleted in their own transactions.
	for range 4 {
		tx, err := conn.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := tx.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('b', 't', '{}') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), `DELETE FROM outbox WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	deadline := time.Now().Add(30 * time.Second)
	for b := nextCheck(); b < 4; b = nextCheck() {
		if time.Now().After(deadline) {
			t.Fatalf("bound %d after 30s, want 4 rows deleted unpublished", b)
		}
	}
	var d dto.Metric
	if err := p.m.DeletedUnpublished.Write(&d); err != nil {
		t.Fatal(err)
	}
	if got := d.GetCounter().GetValue(); got != 4 {
		t.Fatalf("outboxd_poll_deleted_unpublished_rows_total = %v, want 4", got)
	}
	if n := logs.FilterMessageSnippet("before the poller published them").Len(); n != 1 {
		t.Fatalf("%d warnings about rows deleted unpublished, want 1", n)
	}
}
