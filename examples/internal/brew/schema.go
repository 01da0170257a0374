package brew

import (
	"context"
	"embed"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/migrations"
)

// MigrationsTable records the applied versions of the examples' migrations.
const MigrationsTable = "brew_schema_migrations"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate creates the examples' tables on top of outboxd's outbox table
// ("outboxd migrate", migrations.Apply): orders (the order service's) and
// order_status (the status consumer's projection), numbered files of
// migrations/ applied by outboxd's runner and recorded in MigrationsTable,
// then the consumer's deduplication table processed_outbox_ids
// (consumer.Migrate). It is idempotent, and returns what it applied. logger
// may be nil.
func Migrate(ctx context.Context, conn *pgx.Conn, logger *zap.Logger) ([]string, error) {
	fsys, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	applied, err := migrations.ApplyFS(ctx, conn, logger, fsys, MigrationsTable)
	if err != nil {
		return applied, err
	}
	return applied, consumer.Migrate(ctx, conn, consumer.DefaultConfig().DedupTable)
}
