package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testproc"
)

// Application names the publisher's connections carry: the replication
// stream (replication.Open) and the poller's workers (poll).
var publisherApps = []string{"outboxd", "outboxd-poll"}

// publisherBackends are the server processes serving the publisher in the
// database: the walsender under CDC, the workers' backends under polling.
func publisherBackends(ctx context.Context, conn *pgx.Conn, db string) ([]int, error) {
	// Debezium's connections are "Debezium Streaming" (the walsender) and
	// "Debezium General"/"Debezium Heartbeat" and so on.
	rows, _ := conn.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND (application_name = ANY($2) OR application_name LIKE 'Debezium%')`, db, publisherApps)
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// waitNoBackends waits until the publisher's backends are gone (they flush
// their table statistics when they exit).
func waitNoBackends(ctx context.Context, conn *pgx.Conn, db string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		pids, err := publisherBackends(ctx, conn, db)
		if err != nil || len(pids) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// backendsCPU sums the CPU time of server processes (read from /proc: the
// server runs on this machine).
func backendsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, p := range pids {
		if c, err := testproc.CPUTime(p); err == nil {
			sum += c
		}
	}
	return sum
}

// pgCost is what the publisher's own statements cost the server.
type pgCost struct {
	Calls    int64   `json:"calls"`
	Rows     int64   `json:"rows"`      // rows returned or changed
	Blocks   int64   `json:"blocks"`    // shared blocks hit + read
	Dirtied  int64   `json:"dirtied"`   // shared blocks dirtied
	WALBytes int64   `json:"wal_bytes"` // WAL the statements wrote
	ExecMs   float64 `json:"exec_ms"`   // statement execution time
}

// resetStatements clears pg_stat_statements for the current database only:
// other users of the shared server keep theirs.
func resetStatements(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	return err
}

// publisherStatements sums pg_stat_statements over the poller's statements
// (the only ones that name published_at; the writer's INSERT does not, and
// CDC runs none).
func publisherStatements(ctx context.Context, conn *pgx.Conn) (pgCost, error) {
	var c pgCost
	err := conn.QueryRow(ctx, `
		SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(rows), 0)::int8,
		       coalesce(sum(shared_blks_hit + shared_blks_read), 0)::int8,
		       coalesce(sum(shared_blks_dirtied), 0)::int8,
		       coalesce(sum(wal_bytes), 0)::int8, coalesce(sum(total_exec_time), 0)::float8
		  FROM pg_stat_statements
		 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND query ILIKE '%published_at%'`).Scan(&c.Calls, &c.Rows, &c.Blocks, &c.Dirtied, &c.WALBytes, &c.ExecMs)
	return c, err
}

// tableReads is tuples read from the outbox table (sequential + index
// fetches) and tuples updated, from pg_stat_user_tables.
func tableReads(ctx context.Context, conn *pgx.Conn) (read, updated int64, err error) {
	err = conn.QueryRow(ctx, `
		SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), n_tup_upd
		  FROM pg_stat_user_tables WHERE relname = 'outbox' AND schemaname = 'public'`).Scan(&read, &updated)
	return read, updated, err
}

func execSQL(ctx context.Context, conn *pgx.Conn, sql string, args ...any) error {
	_, err := conn.Exec(ctx, sql, args...)
	return err
}

// slotActive reports whether a client streams from the slot.
func slotActive(ctx context.Context, conn *pgx.Conn, slot string) bool {
	var active bool
	err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
	return err == nil && active
}
