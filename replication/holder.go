package replication

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// ReadSlotHolder reads which server process holds the slot cfg.Slot (0:
// none), over a connection of its own opened as ReadServerHistory opens
// one and bounded the same way, the query the same as Open's. A session
// asks it after its checkpoint read barrier was acknowledged: when the
// holder is still the session's own walsender (Stream.BackendPID), the slot
// was not taken over before the barrier landed, so any later owner writes
// its barrier after it — which is what orders the sessions' checkpoint
// epochs (publisher.Identity.Epoch).
func ReadSlotHolder(ctx context.Context, cfg StreamConfig) (pid int, err error) {
	err = withQueryConn(ctx, cfg, fmt.Sprintf("reading who holds slot %q", cfg.Slot), func(rctx context.Context, conn *pgconn.PgConn) error {
		q, err := conn.EscapeString(cfg.Slot)
		if err != nil {
			return fmt.Errorf("replication: quote %q: %w", cfg.Slot, err)
		}
		rows, err := conn.Exec(rctx, slotQuery+"'"+q+"'").ReadAll()
		if err != nil {
			return fmt.Errorf("replication: read slot %q: %w", cfg.Slot, err)
		}
		if len(rows) == 0 || len(rows[0].Rows) == 0 {
			return fmt.Errorf("%w: replication slot %q does not exist (dropped while outboxd set up its session)", ErrSlotMissing, cfg.Slot)
		}
		r := rows[0].Rows[0]
		if string(r[1]) != "t" {
			return nil
		}
		if pid, err = strconv.Atoi(string(r[2])); err != nil {
			return fmt.Errorf("replication: slot %q active_pid %q: %w", cfg.Slot, r[2], err)
		}
		return nil
	})
	return pid, err
}
