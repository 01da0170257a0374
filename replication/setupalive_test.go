package replication

import "testing"

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
