package main

import (
	"testing"
	"time"
)

// The continuous audit's windows leave no row out: a window whose rounds
// were skipped (outboxd lagging) is kept whole, the first one included, and
// a long pause is caught up an hour at a time from where it stopped.
func TestAuditWindowsKeepWhatWasSkipped(t *testing.T) {
	start := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	w := auditWindows{from: start.Add(-time.Second), delay: time.Second}
	since, until, ok := w.next(start.Add(500 * time.Millisecond))
	if !ok || !since.Equal(start.Add(-time.Second)) || !until.Equal(start.Add(-500*time.Millisecond)) {
		t.Fatalf("first window [%s, %s) %v", since, until, ok)
	}
	// That round was skipped: 5 s later the window still starts there.
	if since, _, _ = w.next(start.Add(5 * time.Second)); !since.Equal(start.Add(-time.Second)) {
		t.Fatalf("after skipped rounds the window starts at %s, want %s (the first window's start)", since, start.Add(-time.Second))
	}
	w.from = start.Add(4 * time.Second) // audited up to delay ago
	if since, until, ok = w.next(start.Add(5 * time.Second)); ok {
		t.Fatalf("window [%s, %s) right after one was audited up to now, want none", since, until)
	}
	if since, until, ok = w.next(start.Add(6 * time.Second)); !ok || !since.Equal(start.Add(4*time.Second)) || !until.Equal(start.Add(5*time.Second)) {
		t.Fatalf("next window [%s, %s) %v, want [+4s, +5s)", since, until, ok)
	}
	since, until, _ = w.next(start.Add(3 * time.Hour))
	if !since.Equal(start.Add(4*time.Second)) || until.Sub(since) != maxAuditWindow {
		t.Fatalf("after a pause: [%s, %s), want an hour from where it stopped", since, until)
	}
}
