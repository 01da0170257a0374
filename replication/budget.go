package replication

import (
	"context"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Budget bounds the bytes of decoded events that are out of the stream's
// hands and not yet done downstream: handed over on the channel, held by the
// consumer, queued or in flight to Kafka. The stream asks it for room before each event is handed over, so that a channel of
// messages never holds more bytes than the budget allows, whatever the
// events' size. While there is none, the stream stops reading
// from the server and keeps sending status updates.
type Budget interface {
	// TryAcquire takes room for one event of n bytes if there is some now.
	// An event larger than the whole budget is let through when nothing
	// else holds room, so that it cannot wedge the stream. When it returns
	// false the consumer is told that the stream waits (it must then send
	// what it holds back, or nothing would ever free room).
	TryAcquire(n int64) bool
	// Freed is signalled when room may have been freed since the last
	// failed TryAcquire.
	Freed() <-chan struct{}
}

// EventOverhead is what an event costs beyond its bytes
// (outbox.EventOverhead).
const EventOverhead = outbox.EventOverhead

// acquire takes room for an event of n bytes from b. While there is none
// it reads nothing more from the server (that is the point: the bytes wait
// in the server's WAL, not in memory) and keeps sending status updates, as
// deliver does while out is full.
func (s *Stream) acquire(ctx context.Context, b Budget, n int64, gate Gate, st *streamState) error {
	if b.TryAcquire(n) {
		return nil
	}
	stop := ctx.Done()
	if st.inTxn {
		stop = nil // finish the transaction in hand (see receive)
	}
	timer := time.NewTimer(time.Until(st.lastStatus.Add(s.cfg.StatusInterval)))
	defer timer.Stop()
	for {
		select {
		case <-b.Freed():
			if b.TryAcquire(n) {
				return nil
			}
		case <-stop:
			return errStopped
		case <-gate.Done():
			return errStopped
		case <-timer.C:
			if err := s.sendStatus(st, gate, false); err != nil {
				return err
			}
			timer.Reset(s.cfg.StatusInterval)
		}
	}
}
