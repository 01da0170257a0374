package publisher

import (
	"context"
	"sync"
	"time"
)

// limiter bounds the events and bytes in flight. One goroutine acquires,
// any may release. An event larger than maxBytes is let through alone so it
// cannot wedge the pipeline.
type limiter struct {
	mu                  sync.Mutex
	events, bytes       int64
	maxEvents, maxBytes int64
	wake                chan struct{}
	// progress is when an event was last released, or when the limiter
	// last went from empty to busy: the start of the current wait for
	// Kafka, for the stall metric.
	progress time.Time
}

func newLimiter(maxEvents int, maxBytes int64) *limiter {
	return &limiter{maxEvents: int64(maxEvents), maxBytes: maxBytes, wake: make(chan struct{}, 1)}
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
	if l.events == 0 || (l.events < l.maxEvents && l.bytes+n <= l.maxBytes) {
		if l.events == 0 {
			l.progress = time.Now()
		}
		l.events++
		l.bytes += n
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
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// stalled is how long events have been in flight with none released; zero
// when none is in flight.
func (l *limiter) stalled(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == 0 || now.Before(l.progress) {
		return 0
	}
	return now.Sub(l.progress)
}

func (l *limiter) inFlight() (events, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events, l.bytes
}
