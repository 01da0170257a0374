package poll

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/migrations"
)

// partialIndexSQL reports whether the table $1 (qualified, quoted) has a
// partial index on unpublished rows, whatever its name.
const partialIndexSQL = `
	SELECT EXISTS (SELECT 1 FROM pg_index
	 WHERE indrelid = to_regclass($1) AND indpred IS NOT NULL
	   AND pg_get_expr(indpred, indrelid) ILIKE '%published_at IS NULL%')`

// IndexName is the name Migrate gives the partial index of table.
func IndexName(table string) string { return table + "_unpublished_id_idx" }

// Migrate adds what the poller needs to the outbox table schema.table, which
// must exist ("outboxd migrate" creates public.outbox); "outboxd migrate
// --source=poll" calls it. It returns what it created, nothing when the table
// was ready (as it is on a database migrated by outboxd before version 005,
// whose migration 004 created both):
//
//   - the column published_at timestamptz, NULL until a poller has seen
//     Kafka acknowledge the row; change data capture ignores it. Adding a
//     nullable column without a default rewrites nothing.
//   - the partial index IndexName(table) ON schema.table (id) WHERE
//     published_at IS NULL, unless a partial index on published_at IS NULL
//     exists under any name. It holds only unpublished rows, so a poll reads
//     a few index entries instead of scanning the table. It is built in a
//     transaction (not CONCURRENTLY), which blocks writes to the table while
//     it builds: on a large outbox, create it beforehand with CREATE INDEX
//     CONCURRENTLY.
//
// Rows already in the table stay unpublished for the poller: when switching
// a CDC deployment to polling, first mark what CDC already published, e.g.
// UPDATE outbox SET published_at = now() WHERE id <= <last id in Kafka>.
//
// Migrate runs in one transaction under the advisory lock of outboxd's
// migrations (migrations.LockKey), so concurrent runs serialize.
func Migrate(ctx context.Context, conn *pgx.Conn, schema, table string) (created []string, err error) {
	qualified := pgx.Identifier{schema, table}.Sanitize()
	plain := schema + "." + table
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("poll: migrate %s: begin: %w", plain, err)
	}
	defer func() {
		if err != nil {
			created = nil
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrations.LockKey); err != nil {
		return nil, fmt.Errorf("poll: migrate %s: take advisory lock: %w", plain, err)
	}
	var exists, hasColumn bool
	err = tx.QueryRow(ctx, `
		SELECT to_regclass($1) IS NOT NULL,
		       EXISTS (SELECT 1 FROM pg_attribute
		                WHERE attrelid = to_regclass($1) AND attname = 'published_at' AND NOT attisdropped)`,
		qualified).Scan(&exists, &hasColumn)
	if err != nil {
		return nil, fmt.Errorf("poll: migrate %s: read the catalog: %w", plain, err)
	}
	if !exists {
		return nil, haltf(ErrSchema, "outbox table %s does not exist: create it first (\"outboxd migrate\" creates public.outbox)", plain)
	}
	if !hasColumn {
		if _, err = tx.Exec(ctx, `ALTER TABLE `+qualified+` ADD COLUMN published_at timestamptz`); err != nil {
			return nil, fmt.Errorf("poll: add column published_at to %s: %w", plain, err)
		}
		created = append(created, "column "+plain+".published_at")
	}
	var hasIndex bool
	if err = tx.QueryRow(ctx, partialIndexSQL, qualified).Scan(&hasIndex); err != nil {
		return nil, fmt.Errorf("poll: migrate %s: read indexes: %w", plain, err)
	}
	if !hasIndex {
		idx := IndexName(table)
		if _, err = tx.Exec(ctx, `CREATE INDEX `+pgx.Identifier{idx}.Sanitize()+` ON `+qualified+` (id) WHERE published_at IS NULL`); err != nil {
			return nil, fmt.Errorf("poll: create index %s on %s: %w", idx, plain, err)
		}
		created = append(created, "index "+schema+"."+idx)
	}
	if err = tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("poll: migrate %s: commit: %w", plain, err)
	}
	return created, nil
}
