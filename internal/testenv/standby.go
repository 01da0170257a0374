package testenv

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a physical standby of s (dev/stack pg-standby) and
// starts it: s gets a physical slot named slot that the standby streams
// through, is stopped cleanly for the copy of its data and started again.
// From PostgreSQL 17 on the standby syncs failover slots
// (sync_replication_slots = on) and s waits for the standby before logical
// walsenders send changes (synchronized_standby_slots = slot), so a synced
// slot never runs ahead of the standby. The standby is stopped and removed at
// cleanup. Promote it with SELECT pg_promote().
func (s *PGServer) StartStandby(slot string) *PGServer {
	t := s.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(dsn, sql string, args ...any) {
		t.Helper()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("testenv: standby: %v", err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("testenv: standby: %s: %v", sql, err)
		}
	}
	exec(s.DSN, `SELECT pg_create_physical_replication_slot($1, true)`, slot)

	st := newPGServer(t, "outboxd-pg-standby-")
	dir, port := st.Dir, st.Port
	if err := stack("pg-standby", dir, s.Dir, strconv.Itoa(port), slot); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	st.Start()

	c, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		t.Fatalf("testenv: standby: %v", err)
	}
	defer c.Close(context.Background())
	var version int
	if err := c.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatalf("testenv: standby: %v", err)
	}
	if version >= 170000 {
		exec(s.DSN, `ALTER SYSTEM SET synchronized_standby_slots = `+pgx.Identifier{slot}.Sanitize())
		exec(s.DSN, `SELECT pg_reload_conf()`)
	}
	// Wait until the standby streams from s through the slot.
	for {
		var active bool
		err := c.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err != nil {
			t.Fatalf("testenv: standby: slot %s: %v", slot, err)
		}
		if active {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: standby in %s does not stream from slot %s", dir, slot)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
