package slot

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// AwaitRelease waits until process pid no longer holds the slot named name:
// the slot is inactive, held by another process, or gone (pid 0, unknown:
// until it is inactive or gone). It reads pg_replication_slots on conn every
// every, so a standby takes over within that of the holder's exit instead of
// a whole standby poll interval. It returns ctx's error when ctx ends first,
// or the query's error.
func AwaitRelease(ctx context.Context, conn *pgx.Conn, name string, pid int, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s, err := lookupSlot(ctx, conn, name)
		if err != nil {
			return err
		}
		if s == nil || !s.Active || (pid != 0 && int(deref(s.ActivePID)) != pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
