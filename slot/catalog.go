package slot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/backoff"
)

// SQLSTATE codes this package reacts to.
const (
	sqlstateDuplicateObject = "42710" // CREATE of a publication or slot that exists
	sqlstateUniqueViolation = "23505" // CREATE PUBLICATION racing another: pg_publication's unique index
	sqlstateObjectInUse     = "55006" // dropping a slot a client is streaming from
	sqlstateUndefinedObject = "42704" // dropping a slot that was dropped meanwhile
)

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// slotInfo is one row of pg_replication_slots; nullable columns are pointers.
type slotInfo struct {
	Name              string
	Plugin            *string
	SlotType          string
	Database          *string
	Temporary         bool
	Active            bool
	ActivePID         *int32
	RestartLSN        *string
	ConfirmedFlushLSN *string
	WALStatus         *string
	SafeWALSize       *int64
}

// lookupSlot returns the slot named name, or nil when there is none. A
// logical slot that another session is still creating is waited for (see
// creating): until it has its plugin it looks like a slot of the wrong one.
func lookupSlot(ctx context.Context, conn *pgx.Conn, name string) (*slotInfo, error) {
	return awaitCreated(ctx, name, slotCreationWait, func(ctx context.Context) (*slotInfo, error) {
		return readSlot(ctx, conn, name)
	})
}

// slotCreationWait bounds how long lookupSlot waits for another session's
// slot creation to finish.
const slotCreationWait = time.Minute

// awaitCreated reads the slot until it is not being created (creating),
// waiting 5 ms, doubling up to 200 ms, between reads; it gives up after
// limit with an ErrSlotActive naming the creating session, or when ctx ends.
func awaitCreated(ctx context.Context, name string, limit time.Duration, read func(context.Context) (*slotInfo, error)) (*slotInfo, error) {
	deadline := time.Now().Add(limit)
	for attempt := 1; ; attempt++ {
		s, err := read(ctx)
		if err != nil || s == nil || !s.creating() {
			return s, err
		}
		pid := deref(s.ActivePID)
		if time.Now().After(deadline) {
			e := newError(ErrSlotActive, fmt.Sprintf(
				"replication slot %q has been in creation by another session (PID %d) for over %s (a logical slot waits for the transactions running when it was asked for): wait for it, or end that session with SELECT pg_terminate_backend(%d)",
				name, pid, limit, pid))
			e.PID = pid
			return nil, e
		}
		if !backoff.Sleep(ctx, backoff.Exponential(5*time.Millisecond, 200*time.Millisecond, attempt)) {
			return nil, fmt.Errorf("slot: wait for replication slot %q to be created by PID %d: %w", name, pid, ctx.Err())
		}
	}
}

// creating says whether s is a logical slot another session is creating:
// PostgreSQL lists it, active and ephemeral, from the moment it is reserved,
// and names its plugin only once its decoding context is set up (between
// the two, pg_replication_slots shows the plugin as "").
func (s *slotInfo) creating() bool {
	return s.SlotType == "logical" && deref(s.Plugin) == "" && s.Active
}

// readSlot reads the slot named name as it is now, or nil when there is none.
func readSlot(ctx context.Context, conn *pgx.Conn, name string) (*slotInfo, error) {
	var s slotInfo
	err := conn.QueryRow(ctx, `
SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size
FROM pg_catalog.pg_replication_slots
WHERE slot_name = $1`, name).Scan(
		&s.Name, &s.Plugin, &s.SlotType, &s.Database, &s.Temporary, &s.Active, &s.ActivePID,
		&s.RestartLSN, &s.ConfirmedFlushLSN, &s.WALStatus, &s.SafeWALSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slot: read replication slot %q from pg_replication_slots: %w", name, err)
	}
	return &s, nil
}

// serverVersionNum is server_version_num: 170006 for 17.6.
func serverVersionNum(ctx context.Context, conn *pgx.Conn) (int, error) {
	var v int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0, fmt.Errorf("slot: read server_version_num: %w", err)
	}
	return v, nil
}

// Failover slots (pg_replication_slots.failover, synced) exist from 17 on.
const failoverSlotsVersion = 170000

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// parseLSN parses a pg_lsn in text form; NULL is 0.
func parseLSN(s *string) (pglogrepl.LSN, error) {
	if s == nil {
		return 0, nil
	}
	lsn, err := pglogrepl.ParseLSN(*s)
	if err != nil {
		return 0, fmt.Errorf("slot: parse LSN %q: %w", *s, err)
	}
	return lsn, nil
}

// checkUsable reports why s cannot serve outboxd connected to database db,
// or nil when it can. It does not look at Active: an active slot is usable,
// by one client at a time.
func checkUsable(s *slotInfo, db string) error {
	switch {
	case s.SlotType != "logical":
		return notLogicalError(s.Name, s.SlotType)
	case deref(s.Plugin) != "pgoutput":
		return newError(ErrSlotPlugin, fmt.Sprintf(
			"replication slot %q uses plugin %q, outboxd needs \"pgoutput\": drop it with \"outboxd slot drop\" or choose another --slot",
			s.Name, deref(s.Plugin)))
	case deref(s.Database) != db:
		return newError(ErrSlotPlugin, fmt.Sprintf(
			"replication slot %q belongs to database %q, outboxd is connected to %q: choose another --slot (slot names are cluster-wide) or connect to %q",
			s.Name, deref(s.Database), db, deref(s.Database)))
	case s.Temporary:
		e := newError(ErrSlotPlugin, fmt.Sprintf(
			"replication slot %q is a temporary slot of another session (PID %d), outboxd needs a persistent one: choose another --slot",
			s.Name, deref(s.ActivePID)))
		e.PID = deref(s.ActivePID)
		return e
	case deref(s.WALStatus) == "lost":
		return newError(ErrSlotLost, fmt.Sprintf(
			"replication slot %q has lost WAL it needed (wal_status \"lost\", see max_slot_wal_keep_size) and can no longer stream: drop it with \"outboxd slot drop\", run \"outboxd slot create\", and re-publish outbox rows written since the slot's confirmed_flush_lsn %s",
			s.Name, deref(s.ConfirmedFlushLSN)))
	}
	return nil
}

func notLogicalError(slot, slotType string) error {
	return newError(ErrSlotPlugin, fmt.Sprintf(
		"replication slot %q is a %s slot, outboxd needs a logical \"pgoutput\" slot: drop it with \"outboxd slot drop\" or choose another --slot",
		slot, slotType))
}

func slotMissingError(slot string) error {
	return newError(ErrSlotMissing, fmt.Sprintf(
		"replication slot %q does not exist: run \"outboxd slot create\" or start without --no-create", slot))
}

func currentDatabase(ctx context.Context, conn *pgx.Conn) (string, error) {
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return "", fmt.Errorf("slot: read current_database(): %w", err)
	}
	return db, nil
}

// relation kinds of pg_class.relkind.
const (
	relkindTable       = 'r'
	relkindPartitioned = 'p'
)

var relkindNames = map[byte]string{
	'i': "an index", 'S': "a sequence", 't': "a TOAST table", 'v': "a view",
	'm': "a materialized view", 'c': "a composite type", 'f': "a foreign table",
	'I': "a partitioned index",
}

// outboxTable is the outbox table as the catalog describes it.
type outboxTable struct {
	OID  uint32
	Kind byte
	// Columns maps each column's name to its type, as format_type writes
	// it.
	Columns map[string]string
}

// lookupTable finds the outbox table and its columns, or returns an
// ErrTableMissing error when there is no such table.
func lookupTable(ctx context.Context, conn *pgx.Conn, cfg Config) (*outboxTable, error) {
	var t outboxTable
	var kind string
	err := conn.QueryRow(ctx, `
SELECT c.oid, c.relkind::text
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, cfg.Schema, cfg.Table).Scan(&t.OID, &kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, newError(ErrTableMissing, fmt.Sprintf(
			"outbox table %s does not exist: run \"outboxd migrate\" or create it", cfg.qualifiedTable()))
	}
	if err != nil {
		return nil, fmt.Errorf("slot: look up outbox table %s: %w", cfg.qualifiedTable(), err)
	}
	t.Kind = kind[0]
	if t.Kind != relkindTable && t.Kind != relkindPartitioned {
		what := relkindNames[t.Kind]
		if what == "" {
			what = fmt.Sprintf("a relation of kind %q", kind)
		}
		return nil, newError(ErrTableMissing, fmt.Sprintf(
			"outbox table %s is %s, not a table: outboxd publishes inserts into a table; run \"outboxd migrate\" with another --table or create one",
			cfg.qualifiedTable(), what))
	}
	rows, err := conn.Query(ctx, `
SELECT attname::text, pg_catalog.format_type(atttypid, NULL) FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, t.OID)
	if err != nil {
		return nil, fmt.Errorf("slot: read columns of %s: %w", cfg.qualifiedTable(), err)
	}
	t.Columns = make(map[string]string)
	var name, typ string
	_, err = pgx.ForEachRow(rows, []any{&name, &typ}, func() error {
		t.Columns[name] = typ
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("slot: read columns of %s: %w", cfg.qualifiedTable(), err)
	}
	return &t, nil
}

// Columns outboxd reads from its own outbox table.
const (
	columnID          = "id"
	columnAggregateID = "aggregate_id"
	columnTopic       = "topic"
	columnPayload     = "payload"
)

// columns returns the columns outboxd reads: cfg.Columns, or those of its
// own table when nil.
func (cfg Config) columns(requireTopic bool) []Column {
	if cfg.Columns != nil {
		return cfg.Columns
	}
	return []Column{
		{Name: columnID, Role: "id", Required: true},
		{Name: columnAggregateID, Role: "key", Required: true},
		{Name: columnTopic, Role: "topic", Required: requireTopic},
		{Name: columnPayload, Role: "payload", Required: true},
	}
}

// checkColumns returns the first column of cols the table lacks or has with
// the wrong type.
func checkColumns(cfg Config, table *outboxTable, cols []Column) error {
	for _, c := range cols {
		typ, ok := table.Columns[c.Name]
		if !ok {
			if c.Required {
				return columnMissingError(cfg, c)
			}
			continue
		}
		if len(c.Types) > 0 && !slices.Contains(c.Types, typ) {
			return newError(ErrColumnType, fmt.Sprintf(
				"outbox column %q of %s (the %s) is %s, outboxd reads %s there: change its type or map another column",
				c.Name, cfg.qualifiedTable(), c.Role, typ, strings.Join(c.Types, ", ")))
		}
	}
	return nil
}

func columnMissingError(cfg Config, c Column) error {
	msg := fmt.Sprintf("outbox table %s has no column %q (the %s): add it (see migrations/001_outbox.sql) or map another column", cfg.qualifiedTable(), c.Name, c.Role)
	if c.Role == "topic" {
		msg += ", set a topic template or configure a default topic"
	}
	return newError(ErrColumnMissing, msg)
}
