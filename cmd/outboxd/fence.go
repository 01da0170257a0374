package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/outbox"
)

// fence is the publish fence over HTTP: the position this process last
// confirmed to PostgreSQL, and a way to wait for it to pass a position.
// It is outbox_wait_published's answer without a database round trip:
// the stream sets it after each status update, with the flush position the
// slot's confirmed_flush_lsn becomes, so both fences mean the same (see
// migrations/010_outbox_wait_published.sql for what that is per delivery
// mode).
type fence struct {
	mu        sync.Mutex
	confirmed pglogrepl.LSN
	moved     chan struct{} // closed and replaced when confirmed grows
}

func newFence() *fence { return &fence{moved: make(chan struct{})} }

// set records the position the current stream confirmed. A new stream
// sets the slot's position on its server first, which can be below the
// last one's (a failover to a standby whose slot lagged): the fence then
// goes back with it, so that it never vouches for a position of an old
// primary's history. Waiters are woken only when it grows.
func (f *fence) set(lsn pglogrepl.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	grew := lsn > f.confirmed
	f.confirmed = lsn
	if grew {
		close(f.moved)
		f.moved = make(chan struct{})
	}
}

// wait reports whether the confirmed position reached lsn before ctx
// ended, and the confirmed position it last saw.
func (f *fence) wait(ctx context.Context, lsn pglogrepl.LSN) (bool, pglogrepl.LSN) {
	for {
		f.mu.Lock()
		confirmed, moved := f.confirmed, f.moved
		f.mu.Unlock()
		if confirmed >= lsn {
			return true, confirmed
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return false, confirmed
		}
	}
}

// maxFenceWait bounds one request's wait: a client that needs longer asks
// again, and a forgotten request does not hold a connection for ever.
const maxFenceWait = 5 * time.Minute

// handlePublished serves GET /published?lsn=L&timeout=D: 200 once this
// process has confirmed past L (every event committed before L is in
// Kafka as its delivery mode defines it), 504 when it has not within D
// (not yet, never "lost"), 503 at once unless this process is the active
// one streaming or starting to (a standby or a halted process confirms nothing, and one
// restarting may be about to stream from another server, whose positions
// the last stream's do not vouch for), 400 on a bad request. The body says
// which, with the confirmed position.
func (f *fence) handlePublished(state func() outbox.State) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		lsn, err := pglogrepl.ParseLSN(q.Get("lsn"))
		if err != nil || lsn == 0 {
			http.Error(w, fmt.Sprintf("lsn=%q is not a position: pass one read after the commit, e.g. SELECT pg_current_wal_lsn()", q.Get("lsn")), http.StatusBadRequest)
			return
		}
		timeout := 5 * time.Second
		if v := q.Get("timeout"); v != "" {
			if timeout, err = time.ParseDuration(v); err != nil || timeout < 0 || timeout > maxFenceWait {
				http.Error(w, fmt.Sprintf("timeout=%q: want a duration from 0s to %s, e.g. 5s", v, maxFenceWait), http.StatusBadRequest)
				return
			}
		}
		// Starting streams from this server for the first time: nothing
		// confirmed before it can mislead, so a request waits.
		if st := state(); st != outbox.StateStreaming && st != outbox.StateStarting {
			http.Error(w, fmt.Sprintf("this process is %s, not streaming: ask the active one, ask again, or call outbox_wait_published in PostgreSQL", st), http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		ok, confirmed := f.wait(ctx, lsn)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusGatewayTimeout)
			fmt.Fprintf(w, "not yet: confirmed %s < %s after %s\n", confirmed, lsn, timeout)
			return
		}
		fmt.Fprintf(w, "published: confirmed %s >= %s\n", confirmed, lsn)
	}
}
