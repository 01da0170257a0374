package slot

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// Preflight checks that the database can serve outboxd with cfg, and returns
// an *Error naming the first problem and its fix, or nil. It checks, in this
// order, so that fixing problems one at a time converges:
//
//  1. wal_level is "logical" ([ErrWALLevel]);
//  2. the outbox table exists and is a table ([ErrTableMissing]);
//  3. (with cfg.Tableless: PostgreSQL is 14 or later and outbox_emit
//     exists, [ErrTablelessUnsupported]; no table is checked) it has the
//     columns of cfg.Columns that are required, each of a type
//     outboxd reads in its role ([ErrColumnMissing], [ErrColumnType]); by
//     default id, aggregate_id and payload, and topic unless requireTopic is
//     false because the caller has a default topic;
//  4. the current role has REPLICATION or is a superuser
//     ([ErrNoReplicationRole]);
//  5. if the slot exists, it is a persistent logical pgoutput slot of this
//     database ([ErrSlotPlugin]) that has not lost WAL ([ErrSlotLost]).
//
// A missing slot or publication is not a problem here: [Ensure] creates them
// or reports them. Preflight only reads the catalogs and changes nothing. A
// failing query returns its error wrapped with %w.
func Preflight(ctx context.Context, conn *pgx.Conn, cfg Config, requireTopic bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := checkWALLevel(ctx, conn); err != nil {
		return err
	}
	if cfg.Tableless {
		if err := checkTableless(ctx, conn, cfg.Schema); err != nil {
			return err
		}
	} else {
		table, err := lookupTable(ctx, conn, cfg)
		if err != nil {
			return err
		}
		if err := checkColumns(cfg, table, cfg.columns(requireTopic)); err != nil {
			return err
		}
	}
	if err := checkRole(ctx, conn); err != nil {
		return err
	}
	s, err := lookupSlot(ctx, conn, cfg.Slot)
	if err != nil || s == nil {
		return err
	}
	db, err := currentDatabase(ctx, conn)
	if err != nil {
		return err
	}
	return checkUsable(s, db)
}

// checkTableless checks what the table-less outbox needs: PostgreSQL 14 or
// later (pgoutput's messages option) and the outbox_emit function, in
// schema (named, not looked up through search_path: the stream reads its
// key from there).
func checkTableless(ctx context.Context, conn *pgx.Conn, schema string) error {
	var version int
	var emit bool
	err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int,
       pg_catalog.to_regprocedure(pg_catalog.format('%I.outbox_emit(text,text,jsonb,jsonb)', $1::text)) IS NOT NULL`, schema).Scan(&version, &emit)
	if err != nil {
		return fmt.Errorf("slot: read server_version_num and look up outbox_emit: %w", err)
	}
	if version < 140000 {
		return newError(ErrTablelessUnsupported, fmt.Sprintf(
			"the table-less outbox needs PostgreSQL 14 or later (pgoutput's messages option), this is %d.%d: upgrade, or use the outbox table (--source=cdc)",
			version/10000, version%10000/100))
	}
	if !emit {
		return newError(ErrTablelessUnsupported,
			fmt.Sprintf("function %s.outbox_emit(text, text, jsonb, jsonb) does not exist: run \"outboxd migrate\" (it installs outbox_emit in its connection's current schema), or pass that schema as --schema", pgx.Identifier{schema}.Sanitize()))
	}
	return nil
}

func checkWALLevel(ctx context.Context, conn *pgx.Conn) error {
	var level string
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		return fmt.Errorf("slot: read wal_level: %w", err)
	}
	if level != "logical" {
		return newError(ErrWALLevel, fmt.Sprintf(
			"wal_level is %q, outboxd needs \"logical\": set wal_level = logical in postgresql.conf and restart PostgreSQL", level))
	}
	return nil
}

// checkRole checks current_user: its attributes decide whether
// pg_create_logical_replication_slot may run, and outboxd's replication
// connections log in as the same role (unless a SET ROLE intervenes).
func checkRole(ctx context.Context, conn *pgx.Conn) error {
	var (
		role               string
		super, replication bool
	)
	err := conn.QueryRow(ctx, `
SELECT rolname::text, rolsuper, rolreplication
FROM pg_catalog.pg_roles WHERE rolname = current_user`).Scan(&role, &super, &replication)
	if err != nil {
		return fmt.Errorf("slot: read attributes of current_user from pg_roles: %w", err)
	}
	if super || replication {
		return nil
	}
	return newError(ErrNoReplicationRole, fmt.Sprintf(
		"role %q lacks the REPLICATION attribute: ALTER ROLE %s REPLICATION (or use a role that has it)", role, sqlIdent(role)))
}

var plainSQLIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// sqlIdent returns name as it must be written in SQL: as is when it is a
// plain lower-case identifier, double-quoted otherwise. It is for messages;
// statements always quote.
func sqlIdent(name string) string {
	if plainSQLIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}
