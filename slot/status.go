package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// Status is a replication slot's state as pg_replication_slots shows it,
// with the WAL it holds back, and its publication.
type Status struct {
	Slot     string
	Plugin   string // "" for a physical slot
	Database string // "" for a physical slot
	Active   bool
	// ActivePID is the PID of the backend streaming from the slot, 0 when
	// none.
	ActivePID int32

	// ConfirmedFlushLSN is the position the client confirmed: streaming
	// resumes after it. 0 for a physical slot.
	ConfirmedFlushLSN pglogrepl.LSN
	// RestartLSN is the oldest WAL the slot still needs; 0 once lost.
	RestartLSN pglogrepl.LSN
	// CurrentWALLSN is pg_current_wal_lsn() (pg_last_wal_replay_lsn() on a
	// standby) when the status was read.
	CurrentWALLSN pglogrepl.LSN
	// RetainedWALBytes is CurrentWALLSN - RestartLSN: WAL the server keeps
	// for this slot. 0 when RestartLSN is unknown.
	RetainedWALBytes int64
	// LagBytes is CurrentWALLSN - ConfirmedFlushLSN: WAL written since the
	// client's last confirmation. 0 when ConfirmedFlushLSN is unknown.
	LagBytes int64

	// WALStatus is "reserved", "extended", "unreserved" or "lost".
	WALStatus string
	// SafeWALSize is how many bytes of WAL may still be written before the
	// slot is in danger of becoming "lost"; nil when max_slot_wal_keep_size
	// is -1 (unlimited), or the slot is lost.
	SafeWALSize *int64

	// Failover is pg_replication_slots.failover: a standby with
	// sync_replication_slots = on keeps a copy of the slot. nil before
	// PostgreSQL 17, which has no failover slots.
	Failover *bool
	// Synced is pg_replication_slots.synced: the slot is a standby's copy of
	// a failover slot (always false on a primary; whether a standby holds a
	// ready copy can only be read on that standby). nil before 17.
	Synced *bool
	// InvalidationReason is pg_replication_slots.invalidation_reason
	// ("wal_removed", "rows_removed", ...), "" while the slot is valid or
	// before PostgreSQL 17.
	InvalidationReason string

	// Publication is the configured publication, "" when it does not exist.
	Publication string
	// PublicationTables are the tables the publication publishes, as
	// schema.table, sorted; FOR ALL TABLES and FOR TABLES IN SCHEMA are
	// expanded.
	PublicationTables []string
}

// GetStatus reads the state of cfg's slot and publication. It returns an
// [ErrSlotMissing] error when the slot does not exist; a missing publication
// is reported by an empty Status.Publication.
func GetStatus(ctx context.Context, conn *pgx.Conn, cfg Config) (Status, error) {
	if err := cfg.Validate(); err != nil {
		return Status{}, err
	}
	var (
		s                  slotInfo
		current            *string
		failover, synced   *bool
		invalidationReason *string
	)
	version, err := serverVersionNum(ctx, conn)
	if err != nil {
		return Status{}, err
	}
	failoverColumns := `NULL::bool, NULL::bool, NULL::text`
	if version >= failoverSlotsVersion {
		failoverColumns = `failover, synced, invalidation_reason`
	}
	err = conn.QueryRow(ctx, `
SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size,
       (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
             ELSE pg_catalog.pg_current_wal_lsn() END)::text,
       `+failoverColumns+`
FROM pg_catalog.pg_replication_slots
WHERE slot_name = $1`, cfg.Slot).Scan(
		&s.Name, &s.Plugin, &s.SlotType, &s.Database, &s.Temporary, &s.Active, &s.ActivePID,
		&s.RestartLSN, &s.ConfirmedFlushLSN, &s.WALStatus, &s.SafeWALSize, &current,
		&failover, &synced, &invalidationReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, slotMissingError(cfg.Slot)
	}
	if err != nil {
		return Status{}, fmt.Errorf("slot: read replication slot %q from pg_replication_slots: %w", cfg.Slot, err)
	}
	st := Status{
		Slot:        s.Name,
		Plugin:      deref(s.Plugin),
		Database:    deref(s.Database),
		Active:      s.Active,
		ActivePID:   deref(s.ActivePID),
		WALStatus:   deref(s.WALStatus),
		SafeWALSize: s.SafeWALSize,

		Failover:           failover,
		Synced:             synced,
		InvalidationReason: deref(invalidationReason),
	}
	if st.ConfirmedFlushLSN, err = parseLSN(s.ConfirmedFlushLSN); err != nil {
		return Status{}, err
	}
	if st.RestartLSN, err = parseLSN(s.RestartLSN); err != nil {
		return Status{}, err
	}
	if st.CurrentWALLSN, err = parseLSN(current); err != nil {
		return Status{}, err
	}
	st.RetainedWALBytes = WALDistance(st.CurrentWALLSN, st.RestartLSN)
	st.LagBytes = WALDistance(st.CurrentWALLSN, st.ConfirmedFlushLSN)

	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)`,
		cfg.Publication).Scan(&exists); err != nil {
		return Status{}, fmt.Errorf("slot: read publication %q from pg_publication: %w", cfg.Publication, err)
	}
	if !exists {
		return st, nil
	}
	st.Publication = cfg.Publication
	rows, err := conn.Query(ctx, `
SELECT schemaname::text || '.' || tablename::text
FROM pg_catalog.pg_publication_tables WHERE pubname = $1 ORDER BY 1`, cfg.Publication)
	if err != nil {
		return Status{}, fmt.Errorf("slot: read tables of publication %q: %w", cfg.Publication, err)
	}
	if st.PublicationTables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return Status{}, fmt.Errorf("slot: read tables of publication %q: %w", cfg.Publication, err)
	}
	return st, nil
}

// WALDistance is to - from in bytes, or 0 when either is unknown or from is
// ahead (a client may confirm a position the server has not yet flushed).
func WALDistance(to, from pglogrepl.LSN) int64 {
	if to == 0 || from == 0 || from > to {
		return 0
	}
	return int64(to - from)
}

// ConfirmedFlushLSN returns the confirmed_flush_lsn of the logical slot named
// slot: the position after which streaming resumes. It returns an
// [ErrSlotMissing] error when there is no such slot and an [ErrSlotPlugin]
// error for a physical slot, which has none.
func ConfirmedFlushLSN(ctx context.Context, conn *pgx.Conn, slot string) (pglogrepl.LSN, error) {
	var (
		lsn      *string
		slotType string
	)
	err := conn.QueryRow(ctx, `
SELECT confirmed_flush_lsn::text, slot_type FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`,
		slot).Scan(&lsn, &slotType)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, slotMissingError(slot)
	}
	if err != nil {
		return 0, fmt.Errorf("slot: read confirmed_flush_lsn of replication slot %q: %w", slot, err)
	}
	if lsn == nil {
		if slotType != "logical" {
			return 0, notLogicalError(slot, slotType)
		}
		return 0, fmt.Errorf("slot: replication slot %q has no confirmed_flush_lsn", slot)
	}
	return parseLSN(lsn)
}
