package publisher

import "github.com/jackc/pglogrepl"

// gate is the one object that says what may be confirmed to PostgreSQL now:
// the watermark's done prefix (every event of every transaction up to it
// acknowledged) as far as the delivery mode lets it go — all of it in plain
// mode, only what the checkpoint topic holds with checkpoints. The stream
// asks it (replication.Gate) before every status update; nothing else
// decides a confirmed position.
type gate struct {
	wm   *Watermark
	mode delivery
	done <-chan struct{}
}

// Confirmed is the done prefix.
func (g gate) Confirmed() pglogrepl.LSN { return g.wm.Confirmed() }

// Confirmable is told the position the stream would confirm (the done
// prefix, or past it the server's WAL end while the stream is idle) and
// returns how much of it may be confirmed now.
func (g gate) Confirmable(want pglogrepl.LSN) pglogrepl.LSN { return g.mode.confirmable(want) }

// Done is closed when the pipeline's Run has returned.
func (g gate) Done() <-chan struct{} { return g.done }
