package replication

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// History is the WAL history a server is on: its system identifier, its
// timeline, how far it has flushed WAL, and where each earlier timeline of
// its history ended (TIMELINE_HISTORY). A position written on timeline T is
// on this history when T is the current timeline and the position is not
// ahead of the flushed WAL, or when T is an ancestor and the position is not
// past T's switch point.
type History struct {
	SystemID string
	Timeline int32
	// Database is the database the connection is to.
	Database string
	// Flushed is IDENTIFY_SYSTEM's xlogpos: the WAL flushed so far.
	Flushed pglogrepl.LSN
	// Ends maps each ancestor timeline to the position where the server's
	// history switched away from it.
	Ends map[int32]pglogrepl.LSN
}

// Contains reports whether the position lsn, written on timeline tli, is on
// this history.
func (h *History) Contains(tli int32, lsn pglogrepl.LSN) bool {
	if tli == h.Timeline {
		return lsn <= h.Flushed
	}
	end, ok := h.Ends[tli]
	return ok && lsn <= end
}

// ReadHistory runs IDENTIFY_SYSTEM and, past timeline 1, TIMELINE_HISTORY on
// a replication connection.
func ReadHistory(ctx context.Context, conn *pgconn.PgConn) (*History, error) {
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("replication: identify system: %w", err)
	}
	h := &History{SystemID: sys.SystemID, Timeline: sys.Timeline, Database: sys.DBName, Flushed: sys.XLogPos, Ends: map[int32]pglogrepl.LSN{}}
	if sys.Timeline <= 1 {
		return h, nil
	}
	res, err := pglogrepl.TimelineHistory(ctx, conn, sys.Timeline)
	if err != nil {
		return nil, fmt.Errorf("replication: timeline history of timeline %d: %w", sys.Timeline, err)
	}
	if h.Ends, err = ParseTimelineHistory(res.Content); err != nil {
		return nil, fmt.Errorf("replication: %s: %w", res.FileName, err)
	}
	return h, nil
}

// ReadServerHistory connects as a replication client with cfg's connection
// string, reads the server's history (ReadHistory) and disconnects. It is
// bounded as Open is: connecting by cfg.ConnectTimeout unless the
// connection string sets connect_timeout, and the read by cfg.ConnectTimeout
// too. Unbounded, a server that took the connection and then answered
// nothing held the session in set-up for ever, while the slot's own
// connection stayed alive (a simulation seed found it).
func ReadServerHistory(ctx context.Context, cfg StreamConfig) (*History, error) {
	var h *History
	err := withQueryConn(ctx, cfg, "reading its WAL history", func(rctx context.Context, conn *pgconn.PgConn) (err error) {
		h, err = ReadHistory(rctx, conn)
		return err
	})
	return h, err
}

// withQueryConn runs fn on a replication connection of its own (the
// stream's settings, replication=database), connected within the connect
// timeout and fn bounded by it too: a server that does not answer is an
// error naming what was being read, not a wait.
func withQueryConn(ctx context.Context, cfg StreamConfig, what string, fn func(context.Context, *pgconn.PgConn) error) error {
	cfg = cfg.withDefaults()
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return fmt.Errorf("replication: parse connection string: %w", err)
	}
	if pcfg.ConnectTimeout == 0 {
		pcfg.ConnectTimeout = cfg.ConnectTimeout
	}
	pcfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("replication: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	err = fn(rctx, conn)
	if err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
		return fmt.Errorf("replication: no answer from the server within %s while %s: %w", cfg.ConnectTimeout, what, err)
	}
	return err
}

// ParseTimelineHistory reads a timeline history file: one line per earlier
// timeline, "parent_tli<TAB>switchpoint<TAB>reason", comments after '#'.
func ParseTimelineHistory(content []byte) (map[int32]pglogrepl.LSN, error) {
	ends := map[int32]pglogrepl.LSN{}
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("timeline history line %q: want a timeline and a switch point", sc.Text())
		}
		tli, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("timeline history line %q: timeline: %w", sc.Text(), err)
		}
		lsn, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("timeline history line %q: switch point: %w", sc.Text(), err)
		}
		ends[int32(tli)] = lsn
	}
	return ends, sc.Err()
}
