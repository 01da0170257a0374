package slot

import (
	"fmt"
	"testing"
)

func TestGetStatus(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pg, conn, cfg := newDB(t)
	if _, err := Ensure(ctx, conn, cfg, true); err != nil {
		t.Fatal(err)
	}
	before, err := GetStatus(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if before.Slot != cfg.Slot || before.Plugin != "pgoutput" || before.Database != pg.Database {
		t.Errorf("slot %q plugin %q database %q, want %q pgoutput %q", before.Slot, before.Plugin, before.Database, cfg.Slot, pg.Database)
	}
	if before.Active || before.ActivePID != 0 {
		t.Errorf("Active %v ActivePID %d, want an inactive slot", before.Active, before.ActivePID)
	}
	if before.RestartLSN == 0 || before.ConfirmedFlushLSN == 0 || before.CurrentWALLSN == 0 {
		t.Errorf("LSNs restart %s confirmed %s current %s, want all set", before.RestartLSN, before.ConfirmedFlushLSN, before.CurrentWALLSN)
	}
	if before.RestartLSN > before.ConfirmedFlushLSN || before.ConfirmedFlushLSN > before.CurrentWALLSN {
		t.Errorf("want restart %s <= confirmed %s <= current %s", before.RestartLSN, before.ConfirmedFlushLSN, before.CurrentWALLSN)
	}
	if before.RetainedWALBytes != int64(before.CurrentWALLSN-before.RestartLSN) ||
		before.LagBytes != int64(before.CurrentWALLSN-before.ConfirmedFlushLSN) {
		t.Errorf("retained %d lag %d do not match the LSNs %+v", before.RetainedWALBytes, before.LagBytes, before)
	}
	if before.WALStatus != "reserved" {
		t.Errorf("WALStatus %q, want reserved", before.WALStatus)
	}
	if before.SafeWALSize != nil && *before.SafeWALSize <= 0 {
		t.Errorf("SafeWALSize %d, want nil (unlimited) or positive", *before.SafeWALSize)
	}
	if before.Publication != cfg.Publication || fmt.Sprint(before.PublicationTables) != "[public.outbox]" {
		t.Errorf("publication %q tables %q, want %q [public.outbox]", before.Publication, before.PublicationTables, cfg.Publication)
	}

	// Nobody consumes: the WAL of new outbox rows is retained and is lag.
	mustExec(t, conn, `INSERT INTO outbox (aggregate_id, topic, payload)
SELECT 'agg-' || i, 'topic', jsonb_build_object('i', i, 'pad', repeat('x', 200)) FROM generate_series(1, 2000) i`)
	after, err := GetStatus(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const minGrowth = 2000 * 200 // bytes of payload written
	if after.CurrentWALLSN <= before.CurrentWALLSN {
		t.Errorf("CurrentWALLSN did not advance: %s -> %s", before.CurrentWALLSN, after.CurrentWALLSN)
	}
	if after.RestartLSN != before.RestartLSN || after.ConfirmedFlushLSN != before.ConfirmedFlushLSN {
		t.Errorf("slot moved without a consumer: restart %s -> %s, confirmed %s -> %s",
			before.RestartLSN, after.RestartLSN, before.ConfirmedFlushLSN, after.ConfirmedFlushLSN)
	}
	if after.RetainedWALBytes < before.RetainedWALBytes+minGrowth {
		t.Errorf("RetainedWALBytes %d -> %d, want growth of at least %d", before.RetainedWALBytes, after.RetainedWALBytes, minGrowth)
	}
	if after.LagBytes < before.LagBytes+minGrowth {
		t.Errorf("LagBytes %d -> %d, want growth of at least %d", before.LagBytes, after.LagBytes, minGrowth)
	}

	lsn, err := ConfirmedFlushLSN(ctx, conn, cfg.Slot)
	if err != nil || lsn != after.ConfirmedFlushLSN {
		t.Errorf("ConfirmedFlushLSN = %s, %v; want %s", lsn, err, after.ConfirmedFlushLSN)
	}
}

func TestGetStatusMissing(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	_, conn, cfg := newDB(t)
	want := fmt.Sprintf(`replication slot %q does not exist: run "outboxd slot create" or start without --no-create`, cfg.Slot)
	_, err := GetStatus(ctx, conn, cfg)
	wantError(t, err, want, ErrSlotMissing)
	_, err = ConfirmedFlushLSN(ctx, conn, cfg.Slot)
	wantError(t, err, want, ErrSlotMissing)

	// A slot whose publication is missing: the status says so.
	mustExec(t, conn, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, cfg.Slot)
	st, err := GetStatus(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Publication != "" || st.PublicationTables != nil {
		t.Fatalf("publication %q tables %q, want none", st.Publication, st.PublicationTables)
	}
}
