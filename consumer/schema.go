package consumer

import (
	"context"
	"fmt"
	"strings"
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
//	    origin       text        NOT NULL DEFAULT '',
//	    event_id     text        NOT NULL,
//	    outbox_id    bigint,
//	    topic        text        NOT NULL,
//	    processed_at timestamptz NOT NULL DEFAULT now(),
//	    duplicates   integer     NOT NULL DEFAULT 0,
//	    PRIMARY KEY (origin, event_id)
//	)
//
// A message is a duplicate when its (origin, event id) was processed: origin
// is the outbox-origin header ("" without one), event id the outbox-id
// header as text (an integer, or a uuid in lower case), outbox_id the
// integer id (NULL for a uuid). A table of the first shape (outbox_id
// bigint PRIMARY KEY) is upgraded by [Migrate] or [UpgradeSQL]. A schema
// named in table must exist.
func SchemaSQL(table string) (string, error) {
	ident, err := tableIdent(table)
	if err != nil {
		return "", fmt.Errorf("consumer: %w", err)
	}
	return `CREATE TABLE IF NOT EXISTS ` + ident.Sanitize() + ` (
    origin       text        NOT NULL DEFAULT '',
    event_id     text        NOT NULL,
    outbox_id    bigint,
    topic        text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    duplicates   integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (origin, event_id)
)`, nil
}

// UpgradeSQL returns the statements that bring a deduplication table of the
// first shape (outbox_id bigint PRIMARY KEY) to [SchemaSQL]'s: the rows
// processed so far keep their ids with origin "", so events without an
// outbox-origin header are deduplicated as before. It rewrites the table
// and its primary key under an exclusive lock: on a big table, run it when
// the consumers are stopped. Run it once; [Migrate] runs it when needed.
func UpgradeSQL(table string) (string, error) {
	ident, err := tableIdent(table)
	if err != nil {
		return "", fmt.Errorf("consumer: %w", err)
	}
	t := ident.Sanitize()
	lit := "'" + strings.ReplaceAll(t, "'", "''") + "'"
	return `ALTER TABLE ` + t + ` ADD COLUMN IF NOT EXISTS origin text NOT NULL DEFAULT '', ADD COLUMN IF NOT EXISTS event_id text;
UPDATE ` + t + ` SET event_id = outbox_id::text WHERE event_id IS NULL;
DO $$
DECLARE pk text;
BEGIN
    SELECT conname INTO pk FROM pg_catalog.pg_constraint WHERE conrelid = ` + lit + `::regclass AND contype = 'p';
    IF pk IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', ` + lit + `, pk);
    END IF;
END $$;
ALTER TABLE ` + t + ` ALTER COLUMN event_id SET NOT NULL, ALTER COLUMN outbox_id DROP NOT NULL, ADD PRIMARY KEY (origin, event_id)`, nil
}

// Migrate creates the deduplication table named table (normally
// cfg.DedupTable) unless it exists, and upgrades a table of the first shape
// ([UpgradeSQL]); both in one transaction, under an advisory lock so
// consumers starting at once do not race. Call it before [Consumer.Run], or
// apply SchemaSQL (and UpgradeSQL) with the service's own migrations;
// outboxd migrate does not create this table.
func Migrate(ctx context.Context, db DB, table string) (err error) {
	sql, err := SchemaSQL(table)
	if err != nil {
		return err
	}
	upgrade, err := UpgradeSQL(table)
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
	ident, _ := tableIdent(table)
	var old bool
	err = tx.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_attribute
WHERE attrelid = $1::regclass AND attname = 'event_id' AND NOT attisdropped)`, ident.Sanitize()).Scan(&old)
	if err != nil {
		return fmt.Errorf("consumer: inspect dedup table %s: %w", table, err)
	}
	if old {
		if _, err = tx.Exec(ctx, upgrade); err != nil {
			return fmt.Errorf("consumer: upgrade dedup table %s to (origin, event_id): %w", table, err)
		}
	}
	if err = tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: create dedup table %s: commit: %w", table, err)
	}
	return nil
}
