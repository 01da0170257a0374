package consumer

import (
	"context"
	"fmt"
)

// migrateLockKey is the key of the transaction-scoped advisory lock that
// serializes concurrent runs of [Migrate] against one database (consumers
// starting at once): concurrent CREATE TABLE IF NOT EXISTS of one table can
// fail. It is "outboxc" read as a big-endian integer.
const migrateLockKey int64 = 0x6f7574626f7863

// SchemaSQL returns the idempotent statement that creates the deduplication
// table named table ("table" or "schema.table", as [Config.DedupTable]; the
// names are quoted, so they are case-sensitive), for a service that applies
// its schema with its own migration tool:
//
//	CREATE TABLE IF NOT EXISTS processed_outbox_ids (
//	    outbox_id    bigint      PRIMARY KEY,
//	    topic        text        NOT NULL,
//	    processed_at timestamptz NOT NULL DEFAULT now(),
//	    duplicates   integer     NOT NULL DEFAULT 0
//	)
//
// A schema named in table must exist.
func SchemaSQL(table string) (string, error) {
	ident, err := tableIdent(table)
	if err != nil {
		return "", fmt.Errorf("consumer: %w", err)
	}
	return `CREATE TABLE IF NOT EXISTS ` + ident.Sanitize() + ` (
    outbox_id    bigint      PRIMARY KEY,
    topic        text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    duplicates   integer     NOT NULL DEFAULT 0
)`, nil
}

// Migrate creates the deduplication table named table (normally
// cfg.DedupTable) unless it exists: [SchemaSQL] in one transaction, under an
// advisory lock so consumers starting at once do not race. It changes nothing
// in an existing table. Call it before [Consumer.Run], or apply SchemaSQL with
// the service's own migrations; outboxd migrate does not create this table.
func Migrate(ctx context.Context, db DB, table string) (err error) {
	sql, err := SchemaSQL(table)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: create dedup table %s: begin: %w", table, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLockKey); err != nil {
		return fmt.Errorf("consumer: create dedup table %s: take advisory lock: %w", table, err)
	}
	if _, err = tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("consumer: create dedup table %s: %w", table, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: create dedup table %s: commit: %w", table, err)
	}
	return nil
}
