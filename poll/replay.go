package poll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/outbox"
)

// Range selects the outbox rows to publish again: those created at or after
// Since, or with ids from FromID to ToID (0: no upper bound).
type Range struct {
	Since  time.Time
	FromID int64
	ToID   int64
}

// Validate checks the range alone, so a command can refuse a bad one before it
// connects anywhere.
func (r Range) Validate() error {
	switch {
	case r.Since.IsZero() && r.FromID == 0:
		return errors.New("replay: set --since TIMESTAMP or --from-id N")
	case !r.Since.IsZero() && r.FromID != 0:
		return errors.New("replay: set --since or --from-id, not both")
	case r.ToID != 0 && r.ToID < r.FromID:
		return fmt.Errorf("replay: --to-id %d is below --from-id %d", r.ToID, r.FromID)
	}
	return nil
}

// Replay reads the rows of rng from the outbox table in id order, in batches
// of batch rows, and hands each batch to publish, which returns once the
// batch is in Kafka: for `outboxd replay`, after a lost slot. Rows are read
// as the pgoutput decoder sees them, so they map to the same records. It
// returns how many rows it handed over. The table needs no published_at.
func Replay(ctx context.Context, conn *pgx.Conn, cfg Config, rng Range, batch int, publish func([]outbox.Event) error) (int, error) {
	if err := rng.Validate(); err != nil {
		return 0, err
	}
	tbl, err := inspectFor(ctx, conn, cfg, false)
	if err != nil {
		return 0, err
	}
	where := " WHERE id >= $1 AND ($2::int8 = 0 OR id <= $2)"
	args := []any{rng.FromID, rng.ToID}
	if !rng.Since.IsZero() {
		if !tbl.hasCreated {
			return 0, haltf(ErrSchema, "outbox table %s has no created_at column: replay by --from-id instead of --since", tbl.plain)
		}
		where = " WHERE id >= $1 AND ($2::int8 = 0 OR id <= $2) AND created_at >= $3"
		args = append(args, rng.Since)
	}
	q := tbl.columnsSQL + where + fmt.Sprintf(" ORDER BY id LIMIT %d", batch)
	var events []outbox.Event
	total := 0
	for {
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			return total, fmt.Errorf("replay: select: %w", err)
		}
		if events, err = scanEvents(rows, tbl, events[:0]); err != nil {
			return total, err
		}
		if len(events) == 0 {
			return total, nil
		}
		if err := publish(events); err != nil {
			return total, err
		}
		total += len(events)
		args[0] = events[len(events)-1].ID + 1
	}
}
