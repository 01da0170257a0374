package slot

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// newDB returns a fresh database with the outbox table migrated, a connection
// to it and a Config whose slot name is unique in the cluster. testenv drops
// the database's slots at cleanup.
func newDB(t *testing.T) (*testenv.PG, *pgx.Conn, Config) {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatalf("migrations.Apply: %v", err)
	}
	return pg, conn, testConfig()
}

// newEmptyDB is newDB without the outbox table.
func newEmptyDB(t *testing.T) (*testenv.PG, *pgx.Conn, Config) {
	t.Helper()
	pg := testenv.Postgres(t)
	return pg, pg.Conn(t), testConfig()
}

// testConfig is DefaultConfig with a slot name unique in the cluster (slots
// are cluster-wide; publications belong to the test's own database).
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Slot = testenv.UniqueName("outboxd")
	return cfg
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// wantError checks that err is an *Error that wraps every sentinel and reads
// exactly text.
func wantError(t *testing.T, err error, text string, sentinels ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("err = nil, want %q", text)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s) {
			t.Errorf("errors.Is(err, %v) = false; err = %q", s, err)
		}
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("err is %T, want *slot.Error", err)
	}
	if got := err.Error(); got != text {
		t.Errorf("err.Error() =\n\t%s\nwant\n\t%s", got, text)
	}
}

// slotExists reports whether a slot named name exists.
func slotExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func publicationExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// waitFor polls cond every 20ms until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
