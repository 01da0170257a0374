// Package backoff is outboxd's one backoff: the capped exponential formula,
// jitter, the restart backoff of a supervised session and a sleep that ends
// with its context.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Exponential is the one backoff formula of outboxd: min·2^(attempt-1),
// capped at max (attempt counts from 1).
func Exponential(min, max time.Duration, attempt int) time.Duration {
	d := min
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return minDuration(d, max)
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// Jitter takes up to 20 % off d at random, so retries of many partitions
// (or clients) do not fall into step.
func Jitter(d time.Duration) time.Duration {
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// Backoff is the capped exponential backoff between restarts of a
// supervised session (see Supervisor), with Jitter: an active outboxd and
// its hot standby restarting after the same outage do not hit Postgres and
// Kafka in step.
type Backoff struct {
	min, max time.Duration
	attempt  int
}

// New starts at min and doubles up to max.
func New(min, max time.Duration) *Backoff {
	return &Backoff{min: min, max: max}
}

// Next returns the wait before restarting a session that ran for ran: the
// exponential step less up to 20 % of jitter. A
// session that ran longer than twice the cap was healthy: the backoff starts
// over from min.
func (b *Backoff) Next(ran time.Duration) time.Duration {
	if ran > 2*b.max {
		b.attempt = 0
	}
	b.attempt++
	return Jitter(Exponential(b.min, b.max, b.attempt))
}

// Reset starts the backoff over from min.
func (b *Backoff) Reset() { b.attempt = 0 }

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
