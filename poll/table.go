package poll

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/halt"
)

// ErrSchema means the outbox table cannot be polled as it is: missing, or a
// column missing or of a type outboxd cannot map the way CDC does. Restarting
// does not help; the service halts.
var ErrSchema = halt.New("outbox table not pollable")

// ErrBadRow means a row holds a value CDC would refuse as well (a NULL
// aggregate id or payload, a timestamp out of range). The service halts, as
// CDC does, so the row is looked at rather than skipped.
var ErrBadRow = halt.New("bad outbox row")

// detailError is a message that wraps ErrSchema or ErrBadRow without
// repeating its text.
type detailError struct {
	sentinel error
	msg      string
}

func (e *detailError) Error() string { return e.msg }
func (e *detailError) Unwrap() error { return e.sentinel }

// haltf is a halting error: sentinel with a message of its own.
func haltf(sentinel error, format string, args ...any) error {
	return &detailError{sentinel: sentinel, msg: fmt.Sprintf(format, args...)}
}

// table is what a session learned about the outbox table.
type table struct {
	name       string // quoted schema.table, for SQL
	plain      string // schema.table, for logs
	columnsSQL string // SELECT <the columns an Event needs> FROM <table>
	selectSQL  string
	updateSQL  string
	hasIndex   bool     // a partial index WHERE published_at IS NULL exists
	columns    []string // as found, for logs
	hasTopic   bool
	hasCreated bool
	// reserved are the header names the mapping sets besides outboxd's
	// own, which a row's headers must not name (as the decoder refuses).
	reserved []string
}

// CheckTable reports whether cfg's outbox table can be polled as it is (it
// exists, with the columns and types a session needs), with the message a
// session would halt with: outboxd checks it once at start.
func CheckTable(ctx context.Context, conn *pgx.Conn, cfg Config) error {
	_, err := inspect(ctx, conn, cfg)
	return err
}

// inspect reads the table's columns and builds the statements. Each value is
// selected in the form the pgoutput decoder sees: text output for every type
// except a bytea payload, which is raw bytes; a timestamp without time zone
// is taken as UTC.
func inspect(ctx context.Context, conn *pgx.Conn, cfg Config) (*table, error) {
	return inspectFor(ctx, conn, cfg, true)
}

// inspectFor is inspect; without poll, the table needs no published_at (a
// replay reads any outbox table, as CDC does).
func inspectFor(ctx context.Context, conn *pgx.Conn, cfg Config, poll bool) (*table, error) {
	qualified := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	plain := cfg.Schema + "." + cfg.Table
	types, names, err := readColumns(ctx, conn, qualified, plain)
	if err != nil {
		return nil, err
	}
	if len(types) == 0 {
		return nil, haltf(ErrSchema, "outbox table %s does not exist: run \"outboxd migrate --source=poll\" or create it", plain)
	}
	for _, col := range []string{"id", "aggregate_id", "payload"} {
		if types[col] == "" {
			return nil, missingColumn(plain, col, "add it (see migrations/001_outbox.sql)")
		}
	}
	if poll && types["published_at"] == "" {
		return nil, missingColumn(plain, "published_at", "run \"outboxd migrate --source=poll\" (poll.Migrate adds it)")
	}
	switch types["id"] {
	case "int2", "int4", "int8":
	default:
		return nil, haltf(ErrSchema, "outbox table %s: column \"id\" has type %s, want an integer", plain, types["id"])
	}
	t := &table{name: qualified, plain: plain, columns: names, reserved: cfg.Mapping.OwnHeaders()}
	sel, err := t.selectColumns(types, cfg.DefaultTopic != "")
	if err != nil {
		return nil, err
	}
	t.columnsSQL = "SELECT " + strings.Join(sel, ", ") + " FROM " + qualified
	if !poll {
		return t, nil
	}
	t.selectSQL = t.columnsSQL + " WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
	t.updateSQL = "UPDATE " + qualified + " SET published_at = now() WHERE id = ANY($1)"

	err = conn.QueryRow(ctx, partialIndexSQL, qualified).Scan(&t.hasIndex)
	if err != nil {
		return nil, fmt.Errorf("poll: read indexes of %s: %w", plain, err)
	}
	return t, nil
}

// readColumns reads the table's columns: each one's type by name, and the
// names in table order. No columns: the table does not exist.
func readColumns(ctx context.Context, conn *pgx.Conn, qualified, plain string) (map[string]string, []string, error) {
	rows, err := conn.Query(ctx, `
		SELECT a.attname, t.typname
		  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
		 ORDER BY a.attnum`, qualified)
	if err != nil {
		return nil, nil, fmt.Errorf("poll: read columns of %s: %w", plain, err)
	}
	types := map[string]string{}
	var names []string
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, nil, fmt.Errorf("poll: read columns of %s: %w", plain, err)
		}
		types[name] = typ
		names = append(names, name)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("poll: read columns of %s: %w", plain, err)
	}
	return types, names, nil
}

// selectColumns is the select list of an Event's columns, each in the form
// the pgoutput decoder sees, NULL for an optional column the table lacks
// (topic only with a default topic). It notes which optional columns exist.
func (t *table) selectColumns(types map[string]string, defaultTopic bool) ([]string, error) {
	id := func(col string) string { return pgx.Identifier{col}.Sanitize() }
	sel := []string{id("id") + "::int8", id("aggregate_id") + "::text"}
	if types["payload"] == "bytea" {
		sel = append(sel, id("payload"))
	} else {
		sel = append(sel, id("payload")+"::text")
	}
	if types["topic"] != "" {
		t.hasTopic = true
		sel = append(sel, id("topic")+"::text")
	} else {
		if !defaultTopic {
			return nil, missingColumn(t.plain, "topic", "add it (see migrations/001_outbox.sql) or configure a default topic")
		}
		sel = append(sel, "NULL::text")
	}
	switch types["created_at"] {
	case "":
		sel = append(sel, "NULL::timestamptz")
	case "timestamptz":
		t.hasCreated = true
		sel = append(sel, id("created_at"))
	case "timestamp":
		t.hasCreated = true
		sel = append(sel, id("created_at")+" AT TIME ZONE 'UTC'")
	default:
		return nil, haltf(ErrSchema, "outbox table %s: column \"created_at\" has type %s, want timestamptz or timestamp", t.plain, types["created_at"])
	}
	if types["event_type"] != "" {
		sel = append(sel, id("event_type")+"::text")
	} else {
		sel = append(sel, "NULL::text")
	}
	// The headers column, as CDC sends it: a replayed or polled row
	// without its headers would be another record than the one CDC built.
	if types["headers"] != "" {
		sel = append(sel, id("headers")+"::text")
	} else {
		sel = append(sel, "NULL::text")
	}
	return sel, nil
}

// missingColumn is the halting error for an outbox table without col.
func missingColumn(plain, col, hint string) error {
	return haltf(ErrSchema, "outbox table %s has no column %q: %s", plain, col, hint)
}
