// Package migrations holds outboxd's own schema as numbered SQL files
// embedded in the binary (the outbox table, 001_outbox.sql, and its headers
// column, 005_outbox_headers.sql; the table-less outbox_emit, 006, the key
// it signs its messages with, 007_outbox_emit_key.sql, its check of the
// headers it is given, 008_outbox_emit_headers.sql, and the binding of each
// message to its transaction and the key's rotation, 009_outbox_emit_xid.sql),
// and
// the small runner that applies them, [Apply]. Other owners run their own
// numbered files with the same runner, [ApplyFS], each recording its versions
// in a table of its own: the examples' tables (examples/internal/brew).
//
// Files are named NNN_description.sql and applied in numeric order of NNN,
// each in its own transaction. Applied versions (the NNN prefix, as written)
// are recorded in a version table (outboxd_schema_migrations for outboxd's
// own), so a run is idempotent: a second one applies nothing. Every
// transaction first takes a transaction-scoped advisory lock
// (pg_advisory_xact_lock), so concurrent runs, from several outboxd instances
// starting at once, serialize instead of racing: the later one finds the
// version recorded and skips it.
//
// What outboxd does not need for change data capture is not here: the
// publication (its name is configurable: slot.Ensure creates it), the
// poller's published_at column and index (poll.Migrate, "outboxd migrate
// --source=poll"), the consumer's dedup table (consumer.Migrate) and the
// examples' tables (examples/internal/brew). Versions 002 to 004 held those
// until they moved to their owners; databases migrated then have them
// recorded, so they are retired: a new migration of outboxd's starts at 005.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

//go:embed *.sql
var files embed.FS

// LockKey is the key of the advisory lock that serializes concurrent runs of
// Apply against one database. It is "outboxd" read as a big-endian integer.
const LockKey int64 = 0x6f7574626f7864

// Table is the name of the table that records the applied versions of
// outboxd's own migrations.
const Table = "outboxd_schema_migrations"

// migration is one embedded file.
type migration struct {
	num     int    // numeric prefix, the sort key
	version string // prefix as written ("001"), recorded in Table
	name    string // file name ("001_outbox.sql")
	sql     string
}

// Apply applies outboxd's embedded migrations (the outbox table) that the
// database has not recorded in [Table] yet: [ApplyFS] with outboxd's files.
func Apply(ctx context.Context, conn *pgx.Conn, logger *zap.Logger) (applied []string, err error) {
	return ApplyFS(ctx, conn, logger, files, Table)
}

// ApplyFS applies the NNN_description.sql files at the root of fsys that
// versionTable (created if missing, in the search path) has not recorded yet,
// in numeric order, each in its own transaction, and returns the file names
// it applied (empty when the schema was up to date). Each owner of migrations
// has its own versionTable, so their numbers never collide.
//
// conn must be idle (not inside a transaction). A failing migration is rolled
// back and stops the run; the migrations before it stay applied. logger may be
// nil.
func ApplyFS(ctx context.Context, conn *pgx.Conn, logger *zap.Logger, fsys fs.FS, versionTable string) (applied []string, err error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	if versionTable == "" {
		return nil, errors.New("migrations: no version table named: pass the table that records the applied versions")
	}
	ms, err := load(fsys)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		done, err := applyOne(ctx, conn, versionTable, m)
		if err != nil {
			return applied, err
		}
		if done {
			logger.Info("applied migration", zap.String("file", m.name), zap.String("version", m.version))
			applied = append(applied, m.name)
		} else {
			logger.Debug("migration already applied", zap.String("file", m.name), zap.String("version", m.version))
		}
	}
	return applied, nil
}

// applyOne applies m unless it is recorded, all in one transaction under the
// advisory lock. It reports whether it applied m.
func applyOne(ctx context.Context, conn *pgx.Conn, versionTable string, m migration) (applied bool, err error) {
	vt := pgx.Identifier{versionTable}.Sanitize()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: %s: begin: %w", m.name, err)
	}
	defer func() {
		if err != nil {
			// The error that matters is err; a failed rollback adds nothing
			// (the server aborts the transaction when the connection drops).
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, LockKey); err != nil {
		return false, fmt.Errorf("migrations: %s: take advisory lock: %w", m.name, err)
	}
	if _, err = tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+vt+` (
	version    text PRIMARY KEY,
	applied_at timestamptz DEFAULT now()
)`); err != nil {
		return false, fmt.Errorf("migrations: create %s: %w", versionTable, err)
	}
	var exists bool
	if err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+vt+` WHERE version = $1)`, m.version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migrations: %s: read %s: %w", m.name, versionTable, err)
	}
	if exists {
		return false, tx.Commit(ctx)
	}
	// No arguments: pgx uses the simple protocol, so a file may hold several
	// statements.
	if _, err = tx.Exec(ctx, m.sql); err != nil {
		return false, fmt.Errorf("migrations: apply %s: %w", m.name, err)
	}
	if _, err = tx.Exec(ctx, `INSERT INTO `+vt+` (version) VALUES ($1)`, m.version); err != nil {
		return false, fmt.Errorf("migrations: %s: record version: %w", m.name, err)
	}
	if err = tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrations: %s: commit: %w", m.name, err)
	}
	return true, nil
}

// load reads the *.sql files of fsys and sorts them by numeric prefix. A file
// without a numeric prefix, or two files with the same number, is an error:
// the order must never be ambiguous.
func load(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: list files: %w", err)
	}
	var ms []migration
	seen := make(map[int]string)
	for _, name := range names {
		prefix, _, _ := strings.Cut(name, "_")
		prefix = strings.TrimSuffix(prefix, ".sql")
		num, err := strconv.Atoi(prefix)
		if err != nil || num < 0 || strings.TrimLeft(prefix, "0123456789") != "" {
			return nil, fmt.Errorf("migrations: file %s: name must start with a number, as in 001_outbox.sql", name)
		}
		if other, dup := seen[num]; dup {
			return nil, fmt.Errorf("migrations: files %s and %s have the same number %d", other, name, num)
		}
		seen[num] = name
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("migrations: read %s: %w", name, err)
		}
		ms = append(ms, migration{num: num, version: prefix, name: name, sql: string(b)})
	}
	if len(ms) == 0 {
		return nil, errors.New("migrations: no NNN_description.sql files found")
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].num < ms[j].num })
	return ms, nil
}
