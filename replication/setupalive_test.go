package replication

import (
	"testing"
	"time"
)

// Between Open and Run the session sets up (the producer, the checkpoint
// read behind its barrier): the stream keeps confirming the slot's own
// position meanwhile, so wal_sender_timeout does not end the connection (a
// fresh-clone CI run restarted every 6 s while a 3 s --kafka-linger held
// the checkpoint barrier, with wal_sender_timeout 2 s). Run then takes the
// connection over (under -race, a keepalive still writing would be a race).
func TestStreamKeepsTheServerInformedBeforeRun(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f)) // StatusInterval 20 ms; the slot at 0/1000
	for i := range 3 {
		if u := f.nextStatus(soon); u.flush != 0x1000 || u.write != 0x1000 {
			t.Fatalf("status update %d before Run: write %s flush %s, want the slot's 0/1000", i, u.write, u.flush)
		}
	}
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1)
	f.sendTxn(txn)
	if m := r.recv(soon); m.Kind != KindBegin {
		t.Fatalf("Run after the set-up got %s, want begin", m.Kind)
	}
}

// Close before Run stops the keepalive and waits for it to end.
func TestStreamCloseBeforeRunStopsTheKeepalive(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	f.nextStatus(soon)
	k := s.alive
	s.Close()
	select {
	case <-k.done:
	default:
		t.Fatal("Close returned with the keepalive still running")
	}
}

// A connection that breaks while the session sets up ends Run at once with
// the keepalive's error, and out is closed: the consumer ranging over it
// would otherwise wait for ever, alive and "streaming", on a stream that
// can no longer deliver anything.
func TestStreamRunAfterTheConnectionBrokeDuringSetUpClosesOut(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	f.nextStatus(soon)
	k := s.alive
	f.close() // the server ends the connection; the keepalive's next sends fail
	select {
	case <-k.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the keepalive did not notice the broken connection")
	}
	r := startRun(t, f, s, 0, newFakeProgress(0x1000))
	if got := r.closed(soon); len(got) != 0 {
		t.Fatalf("Run delivered %d messages on a broken connection", len(got))
	}
	if err := r.result(soon); err == nil {
		t.Fatal("Run = nil after the connection broke during set-up, want the keepalive's error")
	}
}
