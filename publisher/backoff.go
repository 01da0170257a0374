package publisher

import (
	"context"
	"time"
)

// Backoff is the capped exponential backoff between restarts of a
// supervised session (the CDC Service, the poller).
type Backoff struct {
	min, max, next time.Duration
}

// NewBackoff starts at min and doubles up to max.
func NewBackoff(min, max time.Duration) *Backoff {
	return &Backoff{min: min, max: max, next: min}
}

// Next returns the wait before restarting a session that ran for ran. A
// session that ran longer than twice the cap was healthy: the backoff starts
// over from min.
func (b *Backoff) Next(ran time.Duration) time.Duration {
	if ran > 2*b.max {
		b.next = b.min
	}
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

// Reset starts the backoff over from min.
func (b *Backoff) Reset() { b.next = b.min }

// Sleep waits d, or until ctx is done; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
