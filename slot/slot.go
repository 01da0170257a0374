package slot

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// publication is one row of pg_publication, plus the outbox table's entry in
// pg_publication_tables.
type publication struct {
	Insert   bool
	ViaRoot  bool
	HasTable bool
	// Columns published of the outbox table; nil when the server predates
	// column lists (PostgreSQL 14) and so publishes all of them.
	Columns []string
}

// lookupPublication returns the publication named cfg.Publication and whether
// it includes the outbox table, or nil when there is none.
func lookupPublication(ctx context.Context, conn *pgx.Conn, cfg Config) (*publication, error) {
	var p publication
	err := conn.QueryRow(ctx, `SELECT pubinsert, pubviaroot FROM pg_catalog.pg_publication WHERE pubname = $1`,
		cfg.Publication).Scan(&p.Insert, &p.ViaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("slot: read publication %q from pg_publication: %w", cfg.Publication, err)
	}
	var version int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return nil, fmt.Errorf("slot: read server_version_num: %w", err)
	}
	// pg_publication_tables expands FOR ALL TABLES and FOR TABLES IN SCHEMA;
	// it lists a partitioned table itself only with publish_via_partition_root.
	attnames := `NULL::text[]`
	if version >= 150000 {
		attnames = `attnames::text[]`
	}
	err = conn.QueryRow(ctx, `SELECT `+attnames+` FROM pg_catalog.pg_publication_tables
WHERE pubname = $1 AND schemaname = $2 AND tablename = $3`,
		cfg.Publication, cfg.Schema, cfg.Table).Scan(&p.Columns)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("slot: read tables of publication %q from pg_publication_tables: %w", cfg.Publication, err)
	default:
		p.HasTable = true
	}
	return &p, nil
}

// checkPublication reports why p does not deliver the outbox table's inserts.
func checkPublication(p *publication, cfg Config, table *outboxTable) error {
	if cfg.Tableless {
		return nil // messages pass no publication filter
	}
	pub, tbl := sqlIdent(cfg.Publication), cfg.qualifiedTable()
	if !p.Insert {
		return newError(ErrPublicationMismatch, fmt.Sprintf(
			"publication %q does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", cfg.Publication, pub))
	}
	if table.Kind == relkindPartitioned && !p.ViaRoot {
		return newError(ErrPublicationMismatch, fmt.Sprintf(
			"publication %q publishes the partitions of %s under their own names: ALTER PUBLICATION %s SET (publish_via_partition_root = true)",
			cfg.Publication, tbl, pub))
	}
	if !p.HasTable {
		return newError(ErrPublicationMismatch, fmt.Sprintf(
			"publication %q does not include table %s: ALTER PUBLICATION %s ADD TABLE %s", cfg.Publication, tbl, pub, tbl))
	}
	if p.Columns != nil {
		published := make(map[string]bool, len(p.Columns))
		for _, c := range p.Columns {
			published[c] = true
		}
		for _, c := range cfg.columns(true) {
			if _, ok := table.Columns[c.Name]; ok && !published[c.Name] {
				return newError(ErrPublicationMismatch, fmt.Sprintf(
					"publication %q does not publish column %q of %s: ALTER PUBLICATION %s SET TABLE %s (without a column list)",
					cfg.Publication, c.Name, tbl, pub, tbl))
			}
		}
	}
	return nil
}

// Ensure makes sure the publication and the slot of cfg exist and fit, and
// returns a description of each object it created, for logging (empty when
// both existed).
//
// It creates, when missing and create is true, first the publication
//
//	CREATE PUBLICATION <publication> FOR TABLE <schema>.<table> WITH (publish = 'insert')
//
// (adding publish_via_partition_root = true for a partitioned table), then a
// persistent slot with pg_create_logical_replication_slot(<slot>, 'pgoutput'),
// which on PostgreSQL 17 or later is a failover slot when cfg.Failover is set
// (pg_create_logical_replication_slot(<slot>, 'pgoutput', false, false, true)).
// The order matters: pgoutput resolves the publication in the catalog as of
// the change it decodes, and fails on changes older than the publication. For
// that reason, when the slot exists but the publication does not, Ensure
// creates nothing and returns [ErrPublicationMissing] advising to re-create the
// slot. Creating the slot waits for transactions running at that moment to end.
//
// With create false, a missing publication or slot is an [ErrPublicationMissing]
// or [ErrSlotMissing] error (one error wrapping both when both are missing)
// saying how to create them.
//
// Whatever create is, an existing publication must publish inserts into the
// outbox table, with the columns outboxd reads ([ErrPublicationMismatch]), and
// an existing slot must be usable as Preflight checks ([ErrSlotPlugin],
// [ErrSlotLost]). A missing outbox table is [ErrTableMissing]. When it is to
// create the slot, Ensure first checks wal_level and the role ([ErrWALLevel],
// [ErrNoReplicationRole]), before it creates anything. Should creating the slot
// fail nonetheless, created still lists the publication created before.
//
// Ensure is safe to run concurrently with itself: when another run creates an
// object first, Ensure checks that object instead.
func Ensure(ctx context.Context, conn *pgx.Conn, cfg Config, create bool) (created []string, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var table *outboxTable
	if !cfg.Tableless {
		if table, err = lookupTable(ctx, conn, cfg); err != nil {
			return nil, err
		}
	}
	db, err := currentDatabase(ctx, conn)
	if err != nil {
		return nil, err
	}
	s, err := lookupSlot(ctx, conn, cfg.Slot)
	if err != nil {
		return nil, err
	}
	if s != nil {
		if err := checkUsable(s, db); err != nil {
			return nil, err
		}
	}
	p, err := lookupPublication(ctx, conn, cfg)
	if err != nil {
		return nil, err
	}
	if s == nil && create {
		// Creating the slot needs both; check before creating anything, so
		// that a failure leaves no half-done setup behind.
		if err := checkWALLevel(ctx, conn); err != nil {
			return nil, err
		}
		if err := checkRole(ctx, conn); err != nil {
			return nil, err
		}
	}

	made, err := ensurePublication(ctx, conn, cfg, table, p, s != nil, create)
	if err != nil {
		return nil, err
	}
	if made != "" {
		created = append(created, made)
	}
	if s != nil {
		return created, nil
	}
	if !create {
		return created, slotMissingError(cfg.Slot)
	}
	made, err = createSlot(ctx, conn, cfg, db)
	if made != "" {
		created = append(created, made)
	}
	return created, err
}

// ensurePublication checks the publication p (nil: it does not exist), or
// creates it when that is allowed; it says what it created, if anything.
// slotExists says whether the slot does: a publication younger than its slot
// cannot serve it.
func ensurePublication(ctx context.Context, conn *pgx.Conn, cfg Config, table *outboxTable, p *publication, slotExists, create bool) (created string, err error) {
	switch {
	case p == nil && slotExists:
		return "", newError(ErrPublicationMissing, fmt.Sprintf(
			"publication %q does not exist but replication slot %q does, and pgoutput cannot decode changes made before its publication existed: drop the slot with \"outboxd slot drop\" and run \"outboxd slot create\" (outbox rows written meanwhile are not published)",
			cfg.Publication, cfg.Slot))
	case p == nil && !create:
		return "", &Error{
			Err: errors.Join(ErrSlotMissing, ErrPublicationMissing),
			Msg: fmt.Sprintf("replication slot %q and publication %q do not exist: run \"outboxd slot create\" or start without --no-create",
				cfg.Slot, cfg.Publication),
		}
	case p == nil:
		if err := createPublication(ctx, conn, cfg, table); err != nil {
			if !isSQLState(err, sqlstateDuplicateObject) && !isSQLState(err, sqlstateUniqueViolation) {
				return "", err
			}
			// Created concurrently: check that one.
			if p, err = lookupPublication(ctx, conn, cfg); err != nil {
				return "", err
			}
			if p == nil {
				return "", fmt.Errorf("slot: publication %q was reported to exist but is not in pg_publication", cfg.Publication)
			}
			return "", checkPublication(p, cfg, table)
		}
		if cfg.Tableless {
			return fmt.Sprintf("publication %q without tables (table-less outbox)", cfg.Publication), nil
		}
		return fmt.Sprintf("publication %q for table %s", cfg.Publication, cfg.qualifiedTable()), nil
	default:
		return "", checkPublication(p, cfg, table)
	}
}

// createSlot creates the replication slot (a failover slot when cfg.Failover
// is set and the server has them) and says what it created. When another run
// created it first, it checks that one and creates nothing.
func createSlot(ctx context.Context, conn *pgx.Conn, cfg Config, db string) (created string, err error) {
	failover := false
	if cfg.Failover {
		v, err := serverVersionNum(ctx, conn)
		if err != nil {
			return "", err
		}
		failover = v >= failoverSlotsVersion
	}
	createSQL := `SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput', false)`
	if failover {
		// temporary false, two_phase false, failover true.
		createSQL = `SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`
	}
	var lsn string
	err = conn.QueryRow(ctx, createSQL, cfg.Slot).Scan(&lsn)
	if err != nil {
		if !isSQLState(err, sqlstateDuplicateObject) {
			return "", fmt.Errorf("slot: create replication slot %q: %w", cfg.Slot, err)
		}
		// Created concurrently: check that one.
		s, err := lookupSlot(ctx, conn, cfg.Slot)
		if err != nil {
			return "", err
		}
		if s == nil {
			return "", fmt.Errorf("slot: replication slot %q was reported to exist but is not in pg_replication_slots", cfg.Slot)
		}
		return "", checkUsable(s, db)
	}
	kind := "pgoutput"
	if failover {
		kind = "pgoutput, failover"
	}
	return fmt.Sprintf("replication slot %q (%s) at LSN %s", cfg.Slot, kind, lsn), nil
}

func createPublication(ctx context.Context, conn *pgx.Conn, cfg Config, table *outboxTable) error {
	var sql strings.Builder
	sql.WriteString("CREATE PUBLICATION ")
	sql.WriteString(pgx.Identifier{cfg.Publication}.Sanitize())
	if cfg.Tableless {
		// A publication without tables: pgoutput needs one by name, and
		// sends messages whatever it publishes.
		if _, err := conn.Exec(ctx, sql.String()); err != nil {
			return fmt.Errorf("slot: create publication %q: %w", cfg.Publication, err)
		}
		return nil
	}
	sql.WriteString(" FOR TABLE ")
	sql.WriteString(pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize())
	sql.WriteString(" WITH (publish = 'insert'")
	if table.Kind == relkindPartitioned {
		sql.WriteString(", publish_via_partition_root = true")
	}
	sql.WriteString(")")
	if _, err := conn.Exec(ctx, sql.String()); err != nil {
		return fmt.Errorf("slot: create publication %q: %w", cfg.Publication, err)
	}
	return nil
}

// Drop drops the slot of cfg and, when dropPublication is true, then its
// publication. Objects that do not exist are skipped, so Drop is idempotent.
//
// Drop refuses, with an [*Error] wrapping [ErrSlotActive] that carries the
// PID, while a client streams from the slot, and with [ErrSlotPlugin] when the
// slot is a logical slot of another database (it may serve another
// deployment); it then drops nothing. Slots of the wrong plugin and physical
// slots are dropped, so that the fix Preflight suggests for them works. Dropping
// the slot discards its position: outbox rows inserted until a new slot
// exists are not published.
func Drop(ctx context.Context, conn *pgx.Conn, cfg Config, dropPublication bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s, err := lookupSlot(ctx, conn, cfg.Slot)
	if err != nil {
		return err
	}
	if s != nil {
		if s.Active {
			return slotActiveError(cfg.Slot, deref(s.ActivePID))
		}
		if s.Database != nil {
			db, err := currentDatabase(ctx, conn)
			if err != nil {
				return err
			}
			if *s.Database != db {
				return newError(ErrSlotPlugin, fmt.Sprintf(
					"replication slot %q belongs to database %q, not %q, and may serve another deployment: connect to %q to drop it, or choose another --slot",
					cfg.Slot, *s.Database, db, *s.Database))
			}
		}
		if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot($1)`, cfg.Slot); err != nil {
			switch {
			case isSQLState(err, sqlstateUndefinedObject):
				// Dropped meanwhile.
			case isSQLState(err, sqlstateObjectInUse):
				// A client started streaming meanwhile.
				var pid int32
				if s, lerr := lookupSlot(ctx, conn, cfg.Slot); lerr == nil && s != nil {
					pid = deref(s.ActivePID)
				}
				return slotActiveError(cfg.Slot, pid)
			default:
				return fmt.Errorf("slot: drop replication slot %q: %w", cfg.Slot, err)
			}
		}
	}
	if dropPublication {
		if _, err := conn.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{cfg.Publication}.Sanitize()); err != nil {
			return fmt.Errorf("slot: drop publication %q: %w", cfg.Publication, err)
		}
	}
	return nil
}

func slotActiveError(slot string, pid int32) error {
	e := newError(ErrSlotActive, fmt.Sprintf(
		"replication slot %q is active (PID %d): stop the client streaming from it, or SELECT pg_terminate_backend(%d), and retry",
		slot, pid, pid))
	if pid == 0 {
		e.Msg = fmt.Sprintf("replication slot %q is active: stop the client streaming from it and retry", slot)
	}
	e.PID = pid
	return e
}
