package poll

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// unseenDeletes notices rows the poller can never publish: rows deleted
// before a poll saw them, as the insert-then-delete pattern (a row inserted
// and deleted in one transaction, Debezium's recommended way to keep the
// table empty) or a cleanup job that deletes unpublished rows do. CDC
// publishes those rows from the WAL; polling cannot, and the rows leave no
// trace in the table.
//
// The statistics do. Each row the poller publishes gets one UPDATE (its
// published_at); a row deleted without ever being published got none. So,
// from the table's cumulative counters since a baseline,
//
//	deleted unpublished ≥ Δn_tup_del − Δn_tup_upd − published rows present at the baseline
//
// a lower bound: an UPDATE by anyone else, a rolled-back batch's UPDATE or a
// cleanup of published rows only lowers it, and a rolled-back INSERT is
// never in it. Statistics are flushed by each backend a little late (about
// a second for a busy backend, at most 10 s for an idle one), so a DELETE
// can be counted before the UPDATE that published its row: only a bound
// seen at two consecutive checks, an interval apart, is reported — the
// default interval (30 s) outlasts the delay. What can still inflate it is
// a DELETE rolled back (PostgreSQL counts attempted deletes) or one
// committed in the seconds before the baseline and flushed after it.
type unseenDeletes struct {
	interval time.Duration
	log      *zap.Logger
	metric   func(float64) // adds to outboxd_poll_deleted_unpublished_rows_total

	based     bool
	del0      int64 // n_tup_del at the baseline
	upd0      int64 // n_tup_upd at the baseline
	published int64 // rows with published_at present at the baseline
	last      int64 // the bound at the previous check
	reported  int64 // the bound last reported
	next      time.Time
	onCheck   func(confirmed int64) // tests: called after each comparison
}

// check runs the comparison when it is due, on conn outside any
// transaction. A failed query is logged and tried again at the next
// interval: this is a diagnostic, never a reason to stop publishing.
func (u *unseenDeletes) check(ctx context.Context, conn *pgx.Conn, tbl *table) {
	if u == nil || u.interval <= 0 || time.Now().Before(u.next) {
		return
	}
	u.next = time.Now().Add(u.interval)
	if err := u.compare(ctx, conn, tbl); err != nil && ctx.Err() == nil {
		u.log.Debug("poll: could not compare the outbox table's statistics", zap.Error(err))
	}
}

func (u *unseenDeletes) compare(ctx context.Context, conn *pgx.Conn, tbl *table) error {
	var del, upd int64
	err := conn.QueryRow(ctx, `SELECT n_tup_del, n_tup_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)`,
		tbl.name).Scan(&del, &upd)
	if err != nil {
		return fmt.Errorf("read pg_stat_user_tables: %w", err)
	}
	if !u.based || del < u.del0 || upd < u.upd0 { // first time, or the statistics were reset
		var published int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+tbl.name+` WHERE published_at IS NOT NULL`).Scan(&published); err != nil {
			return fmt.Errorf("count published rows: %w", err)
		}
		u.based, u.del0, u.upd0, u.published, u.last, u.reported = true, del, upd, published, 0, 0
		return nil
	}
	now := (del - u.del0) - (upd - u.upd0) - u.published
	bound := min(now, u.last)
	u.last = now
	if u.onCheck != nil {
		defer u.onCheck(bound) // after the metric and the warning
	}
	if bound <= u.reported {
		return nil
	}
	u.metric(float64(bound - u.reported))
	u.reported = bound
	u.log.Warn("rows were deleted from the outbox before the poller published them: they will never be published; "+
		"the insert-then-delete pattern (or a cleanup job deleting rows whose published_at is NULL) needs --source=cdc",
		zap.String("table", tbl.plain), zap.Int64("deleted_unpublished_at_least", bound))
	return nil
}
