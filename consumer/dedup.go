package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the consumer needs of PostgreSQL. *pgxpool.Pool satisfies it;
// it must be safe for concurrent use (one transaction per partition).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Ping(ctx context.Context) error
}

// store runs one attempt at a message: the dedup row and the handler in one
// transaction. The real one is pgStore; the tests use a fake.
type store interface {
	// attempt reports dup when the outbox id was processed before (nothing
	// else happened but the duplicate count). The error is a *dbError for
	// failures of the consumer's own statements, else the handler's error
	// or a commit the server refused.
	attempt(ctx context.Context, m *Message, h Handler) (dup bool, err error)
	// attemptBatch is attempt for several messages in one transaction:
	// dup[i] reports ms[i] as a duplicate (processed before, or its id met
	// earlier in ms), and h gets the others. On error nothing happened.
	attemptBatch(ctx context.Context, ms []*Message, h BatchHandler) (dup []bool, err error)
	ping(ctx context.Context) error
}

// pgStore is the store on a DB.
type pgStore struct {
	db             DB
	table          string
	insertSQL      string
	dupSQL         string
	insertBatchSQL string // $1 origins, $2 event ids, $3 outbox ids, $4 topics; returns the new (origin, event id)
	dupBatchSQL    string // $1 origins, $2 event ids of the duplicates, repeated per duplicate
}

func newPGStore(db DB, table string) (*pgStore, error) {
	ident, err := tableIdent(table)
	if err != nil {
		return nil, err
	}
	t := ident.Sanitize()
	return &pgStore{
		db:        db,
		table:     table,
		insertSQL: `INSERT INTO ` + t + ` (origin, event_id, outbox_id, topic) VALUES ($1, $2, nullif($3::bigint, 0), $4) ON CONFLICT DO NOTHING`,
		dupSQL:    `UPDATE ` + t + ` SET duplicates = duplicates + 1 WHERE origin = $1 AND event_id = $2`,
		insertBatchSQL: `INSERT INTO ` + t + ` (origin, event_id, outbox_id, topic)` +
			` SELECT o, e, nullif(i, 0), tp FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(o, e, i, tp)` +
			` ON CONFLICT DO NOTHING RETURNING origin, event_id`,
		dupBatchSQL: `UPDATE ` + t + ` AS p SET duplicates = p.duplicates + d.n` +
			` FROM (SELECT o, e, count(*)::int AS n FROM unnest($1::text[], $2::text[]) AS u(o, e) GROUP BY o, e) AS d` +
			` WHERE p.origin = d.o AND p.event_id = d.e`,
	}, nil
}

// tableIdent parses "table" or "schema.table".
func tableIdent(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("dedup table %q: want table or schema.table", name)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("dedup table %q: empty name", name)
		}
	}
	return pgx.Identifier(parts), nil
}

func (s *pgStore) ping(ctx context.Context) error { return s.db.Ping(ctx) }

func (s *pgStore) attempt(ctx context.Context, m *Message, h Handler) (dup bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return false, &dbError{op: "begin", err: err}
	}
	committed := false
	defer func() {
		if !committed {
			// The error that matters is err; a failed rollback means the
			// connection is gone, and the server rolled back already.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	tag, err := tx.Exec(ctx, s.insertSQL, m.Origin, m.dedupID(), m.OutboxID, m.Topic)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			// Retried like any database failure, so creating the table
			// lets the consumer go on; until then the log says how.
			return false, &dbError{op: fmt.Sprintf("record outbox id %s: dedup table %s missing: create it with consumer.Migrate or consumer.SchemaSQL (outboxd migrate does not)", m.dedupID(), s.table), err: err}
		}
		if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column
			return false, &dbError{op: fmt.Sprintf("record outbox id %s: dedup table %s has the old shape (no origin, event_id): upgrade it with consumer.Migrate or consumer.UpgradeSQL", m.dedupID(), s.table), err: err}
		}
		return false, &dbError{op: fmt.Sprintf("record outbox id %s", m.dedupID()), err: err}
	}
	if tag.RowsAffected() == 0 {
		if _, err := tx.Exec(ctx, s.dupSQL, m.Origin, m.dedupID()); err != nil {
			return false, &dbError{op: fmt.Sprintf("count duplicate of outbox id %s", m.dedupID()), err: err}
		}
		if err := tx.Commit(ctx); err != nil {
			return false, &dbError{op: "commit duplicate count", err: err}
		}
		committed = true
		return true, nil
	}
	if err := callHandler(ctx, h, tx, m); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, commitError(err)
	}
	committed = true
	return false, nil
}

// commitError classifies a failed commit of the handler's transaction. The
// server refused (a deferred constraint, a serialization failure): the
// handler's writes are at fault, so it counts as a failed attempt.
// Otherwise the connection broke and the outcome is unknown: the next
// attempt finds out through the dedup row.
func commitError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("commit: %w", err)
	}
	return &dbError{op: "commit", err: err}
}

// callHandler runs h, turning a panic into a domain error: it would panic
// again on every retry.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Domainf("handler panicked: %v", r)
		}
	}()
	return h.Handle(ctx, tx, m)
}
