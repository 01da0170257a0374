package publisher

import (
	"context"
	"sync"
	"time"
)

// limiter is the session's one budget of events and bytes, so that memory
// is bounded whatever the events' size and however long Kafka is away: an
// event holds room from the moment the stream hands it over (the Stream
// acquires it through the pipeline's replication.Budget) until Kafka
// acknowledged it or the dead-letter topic took it. The pipeline's
// held-back records, the producer's queues, batches and requests, the open
// exactly-once transaction and the dead-letter path all hold events that
// still hold their room. An event larger than maxBytes is let through alone
// so it cannot wedge the pipeline.
type limiter struct {
	mu                  sync.Mutex
	events, bytes       int64
	maxEvents, maxBytes int64
	// wake is signalled on every release, for the pipeline's own waits.
	wake chan struct{}
	// freed is signalled on every release, for the stream's waits.
	freed chan struct{}
	// wanted is signalled, and waiting set, when the stream found no room:
	// the pipeline must then send what it holds back.
	wanted  chan struct{}
	waiting bool
	// handedOver counts the events the stream took room for that the
	// pipeline has not taken yet (in the channel between them): they hold
	// room, but no wait for acknowledgements (drain) may count on them.
	handedOver int64
	// progress is when an event was last released, or when the limiter
	// last went from empty to busy: the start of the current wait for
	// Kafka, for the stall metric.
	progress time.Time
}

func newLimiter(maxEvents int, maxBytes int64) *limiter {
	return &limiter{maxEvents: int64(maxEvents), maxBytes: maxBytes,
		wake: make(chan struct{}, 1), freed: make(chan struct{}, 1), wanted: make(chan struct{}, 1)}
}

// streamAcquire is tryAcquire for the stream: when there is no room it
// notes that the stream waits and tells the pipeline.
func (l *limiter) streamAcquire(n int64) bool {
	l.mu.Lock()
	// One critical section: were events counted before handedOver, a drain
	// reading produced() in between would wait for an event nobody
	// produced, with nothing in flight to wake it (a silent hang, seen as
	// TestRunExactlyOnceKill9UnderLoad losing its tail).
	if l.tryAcquireLocked(n) {
		l.handedOver++
		l.mu.Unlock()
		return true
	}
	l.waiting = true
	l.mu.Unlock()
	signal(l.wanted)
	return false
}

// streamWaiting reports whether the stream waits for room.
func (l *limiter) streamWaiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// resize changes the bytes an event holds from old to n (a decoded event
// becoming a record) without waiting: the event already holds room.
func (l *limiter) resize(old, n int64) {
	l.mu.Lock()
	l.handedOver--
	l.bytes += n - old
	l.mu.Unlock()
	if n < old {
		signal(l.wake)
		signal(l.freed)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (l *limiter) acquire(ctx context.Context, n int64) error {
	for {
		if l.tryAcquire(n) {
			return nil
		}
		select {
		case <-l.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryAcquire acquires room for an event of n bytes if there is some now.
func (l *limiter) tryAcquire(n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tryAcquireLocked(n)
}

// take counts an event of n bytes that is released before the caller
// returns (a dead-lettered bad event), without waiting for room.
func (l *limiter) take(n int64) {
	l.mu.Lock()
	if l.events == 0 {
		l.progress = time.Now()
	}
	l.events++
	l.bytes += n
	l.mu.Unlock()
}

// tryAcquireLocked is tryAcquire with l.mu held.
func (l *limiter) tryAcquireLocked(n int64) bool {
	if l.events == 0 || (l.events < l.maxEvents && l.bytes+n <= l.maxBytes) {
		if l.events == 0 {
			l.progress = time.Now()
		}
		l.events++
		l.bytes += n
		l.waiting = false
		return true
	}
	return false
}

func (l *limiter) release(n int64) {
	l.mu.Lock()
	l.events--
	l.bytes -= n
	l.progress = time.Now()
	l.mu.Unlock()
	signal(l.wake)
	signal(l.freed)
}

// Stalled is how long events have been in flight with none released; zero
// when none is in flight.
func (l *limiter) Stalled(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == 0 || now.Before(l.progress) {
		return 0
	}
	return now.Sub(l.progress)
}

// releaseHandedOver releases an event the stream handed over that the
// pipeline drops (a skipped transaction's).
func (l *limiter) releaseHandedOver(n int64) {
	l.mu.Lock()
	l.handedOver--
	l.events--
	l.bytes -= n
	l.progress = time.Now()
	l.mu.Unlock()
	signal(l.wake)
	signal(l.freed)
}

// produced is the number of events handed to the producer (or failing)
// and not yet back: what a drain waits for.
func (l *limiter) produced() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events - l.handedOver
}

func (l *limiter) inFlight() (events, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events, l.bytes
}
