package slot

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// TestEnsureCreatesFailoverSlotsOn17: on PostgreSQL 17 the slot is created
// with failover (unless Config.Failover is off) and GetStatus reports the
// failover and synced columns; before 17 (the shared stack's 15) both are nil.
func TestEnsureCreatesFailoverSlotsOn17(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	srv := testenv.StartPostgresVersion(t, "17")
	conn, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		t.Fatalf("migrations.Apply: %v", err)
	}

	for _, failover := range []bool{true, false} {
		cfg := testConfig()
		cfg.Failover = failover
		created, err := Ensure(ctx, conn, cfg, true)
		if err != nil {
			t.Fatalf("Ensure(failover=%v): %v", failover, err)
		}
		kind := "pgoutput"
		if failover {
			kind = "pgoutput, failover"
		}
		if last := created[len(created)-1]; !strings.HasPrefix(last, fmt.Sprintf("replication slot %q (%s) at LSN ", cfg.Slot, kind)) {
			t.Errorf("Ensure(failover=%v) created %q", failover, created)
		}
		var got bool
		if err := conn.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != failover {
			t.Errorf("pg_replication_slots.failover = %v, want %v", got, failover)
		}
		st, err := GetStatus(ctx, conn, cfg)
		if err != nil {
			t.Fatalf("GetStatus: %v", err)
		}
		if st.Failover == nil || *st.Failover != failover || st.Synced == nil || *st.Synced || st.InvalidationReason != "" {
			t.Errorf("GetStatus: failover %v synced %v invalidation %q, want %v, false, \"\"",
				fmtBool(st.Failover), fmtBool(st.Synced), st.InvalidationReason, failover)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, cfg.Slot); err != nil {
			t.Fatal(err)
		}
	}

	// The shared stack (Debian's 15): no failover slots, nil columns.
	_, conn15, cfg := newDB(t)
	if _, err := Ensure(ctx, conn15, cfg, true); err != nil {
		t.Fatalf("Ensure on the shared server: %v", err)
	}
	st, err := GetStatus(ctx, conn15, cfg)
	if err != nil {
		t.Fatalf("GetStatus: %v", err)
	}
	var version int
	if err := conn15.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < failoverSlotsVersion && (st.Failover != nil || st.Synced != nil) {
		t.Errorf("GetStatus on %d: failover %v synced %v, want nil", version, fmtBool(st.Failover), fmtBool(st.Synced))
	}
}

func fmtBool(b *bool) string {
	if b == nil {
		return "<nil>"
	}
	return fmt.Sprint(*b)
}
