package publisher

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
)

// txn is one transaction in flight.
type txn struct {
	end        pglogrepl.LSN
	commitTime time.Time
	pending    int  // events produced and not yet acked
	committed  bool // its Commit was seen, so end is known and no more events come
}

// Watermark keeps the transactions in flight in commit order and yields the
// end LSN of the last transaction of the contiguous prefix that is done
// (committed and every event acked). Begin, Add and Commit are called by one
// goroutine, Ack by another; all are safe for concurrent use.
type Watermark struct {
	mu        sync.Mutex
	queue     []*txn // commit order; queue[0] is the oldest not yet confirmed
	confirmed atomic.Uint64
}

// NewWatermark starts at the slot's confirmed position.
func NewWatermark(start pglogrepl.LSN) *Watermark {
	w := &Watermark{}
	w.confirmed.Store(uint64(start))
	return w
}

// Confirmed is the end LSN of the last transaction of the done prefix.
func (w *Watermark) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(w.confirmed.Load()) }

// Begin opens a transaction at the tail.
func (w *Watermark) Begin(commitTime time.Time) *txn {
	t := &txn{commitTime: commitTime}
	w.mu.Lock()
	w.queue = append(w.queue, t)
	w.mu.Unlock()
	return t
}

// Add counts one more event of t in flight.
func (w *Watermark) Add(t *txn) {
	w.mu.Lock()
	t.pending++
	w.mu.Unlock()
}

// Ack counts one event of t as durable in Kafka.
func (w *Watermark) Ack(t *txn) {
	w.mu.Lock()
	t.pending--
	w.advance()
	w.mu.Unlock()
}

// Commit records t's end LSN; t is done once its events are acked.
//
// A transaction that is done at its commit (no event in flight: an empty
// one, as PostgreSQL 14 sends for every transaction, or one whose events
// were all acknowledged) merges into the done transaction before it, so a
// flood of them behind one slow acknowledgement keeps the queue short.
func (w *Watermark) Commit(t *txn, end pglogrepl.LSN) {
	w.mu.Lock()
	t.end = end
	t.committed = true
	if n := len(w.queue); t.pending == 0 && n >= 2 && w.queue[n-1] == t {
		if prev := w.queue[n-2]; prev.committed && prev.pending == 0 {
			prev.end = end
			w.queue[n-1] = nil
			w.queue = w.queue[:n-1]
		}
	}
	w.advance()
	w.mu.Unlock()
}

// InFlight is the number of transactions not yet confirmed.
func (w *Watermark) InFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// OldestCommitTime is the commit time of the oldest unconfirmed transaction,
// zero when none is in flight.
func (w *Watermark) OldestCommitTime() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return time.Time{}
	}
	return w.queue[0].commitTime
}

// advance pops the done prefix. Called with mu held.
func (w *Watermark) advance() {
	i := 0
	var last *txn
	for i < len(w.queue) && w.queue[i].committed && w.queue[i].pending == 0 {
		last = w.queue[i]
		w.queue[i] = nil
		i++
	}
	if last == nil {
		return
	}
	w.queue = w.queue[i:]
	if len(w.queue) == 0 {
		w.queue = w.queue[:0:0] // let the backing array go
	}
	if uint64(last.end) > w.confirmed.Load() {
		w.confirmed.Store(uint64(last.end))
	}
}
