package replication

import (
	"context"
	"errors"
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
func ReadSlotHolder(ctx context.Context, cfg StreamConfig) (int, error) {
	cfg = cfg.withDefaults()
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return 0, fmt.Errorf("replication: parse connection string: %w", err)
	}
	if pcfg.ConnectTimeout == 0 {
		pcfg.ConnectTimeout = cfg.ConnectTimeout
	}
	pcfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return 0, fmt.Errorf("replication: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	q, err := conn.EscapeString(cfg.Slot)
	if err != nil {
		return 0, fmt.Errorf("replication: quote %q: %w", cfg.Slot, err)
	}
	rows, err := conn.Exec(rctx, slotQuery+"'"+q+"'").ReadAll()
	if err != nil {
		if errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return 0, fmt.Errorf("replication: no answer from the server within %s while reading who holds slot %q: %w", cfg.ConnectTimeout, cfg.Slot, err)
		}
		return 0, fmt.Errorf("replication: read slot %q: %w", cfg.Slot, err)
	}
	if len(rows) == 0 || len(rows[0].Rows) == 0 {
		return 0, fmt.Errorf("%w: replication slot %q does not exist (dropped while outboxd set up its session)", ErrSlotMissing, cfg.Slot)
	}
	r := rows[0].Rows[0]
	if string(r[1]) != "t" {
		return 0, nil
	}
	pid, err := strconv.Atoi(string(r[2]))
	if err != nil {
		return 0, fmt.Errorf("replication: slot %q active_pid %q: %w", cfg.Slot, r[2], err)
	}
	return pid, nil
}
