package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/outbox"
)

// The HTTP fence answers 200 once the confirmed position passes the one
// asked for — a waiting request is released by the confirm, not by its
// timeout —, 504 at the timeout, 503 at once where nothing is confirmed,
// 400 on a bad request.
func TestFenceAnswers(t *testing.T) {
	f := newFence()
	f.set(0x100)
	state := outbox.StateStreaming
	h := f.handlePublished(func() outbox.State { return state })
	get := func(query string) (int, string) {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodGet, "/published?"+query, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("lsn=0/100&timeout=0s"); code != http.StatusOK {
		t.Errorf("a position confirmed already: %d %q, want 200", code, body)
	}
	done := make(chan int, 1)
	go func() {
		code, _ := get("lsn=0/200&timeout=1m")
		done <- code
	}()
	// Whether the request waits already or not, the confirm past its
	// position answers it, long before its minute.
	f.set(0x200)
	select {
	case code := <-done:
		if code != http.StatusOK {
			t.Fatalf("released by the confirm: %d, want 200", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a confirm past the position did not release the waiting request")
	}
	start := time.Now()
	if code, body := get("lsn=0/300&timeout=50ms"); code != http.StatusGatewayTimeout || !strings.Contains(body, "confirmed 0/200 < 0/300") {
		t.Errorf("not reached: %d %q, want 504 naming both positions", code, body)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("504 before the timeout")
	}
	for _, q := range []string{"", "lsn=x", "lsn=0/0", "lsn=0/1&timeout=-1s", "lsn=0/1&timeout=1h", "lsn=0/1&timeout=soon"} {
		if code, body := get(q); code != http.StatusBadRequest {
			t.Errorf("%q: %d %q, want 400", q, code, body)
		}
	}
	for _, st := range []outbox.State{outbox.StateStandby, outbox.StateRestarting, outbox.StateHalted, outbox.StateStopped} {
		state = st
		if code, body := get("lsn=0/100&timeout=1m"); code != http.StatusServiceUnavailable || !strings.Contains(body, "outbox_wait_published") {
			t.Errorf("%s, a position confirmed before: %d %q, want 503 at once pointing to the SQL fence", st, code, body)
		}
	}
}

// A new stream's start (a failover to a standby whose slot lagged) moves
// the fence back: a position the old primary's stream confirmed is no
// longer vouched for. wait ends with its context.
func TestFenceFollowsANewStreamBack(t *testing.T) {
	f := newFence()
	f.set(0x200)
	f.set(0x100) // the next stream's Open, on another server
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if ok, c := f.wait(ctx, pglogrepl.LSN(0x200)); ok || c != 0x100 {
		t.Errorf("wait(0/200) after set(0/200), set(0/100): %v at %s, want not yet at 0/100", ok, c)
	}
	if ok, _ := f.wait(context.Background(), pglogrepl.LSN(0x100)); !ok {
		t.Errorf("wait at the confirmed position returned false")
	}
}
