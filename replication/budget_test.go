package replication

import (
	"sync"
	"testing"
	"time"
)

// budgetProgress is a fakeProgress with a Budget of room bytes.
type budgetProgress struct {
	*fakeProgress
	mu    sync.Mutex
	room  int64
	freed chan struct{}
}

func (b *budgetProgress) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.room {
		return false
	}
	b.room -= n
	return true
}

func (b *budgetProgress) Freed() <-chan struct{} { return b.freed }

func (b *budgetProgress) free(n int64) {
	b.mu.Lock()
	b.room += n
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// Rule (memory bounded whatever the events' size): the stream takes room
// from the consumer's Budget before it hands an event over, says how much
// in Message.Budgeted, and while there is none it hands nothing over and
// keeps sending status updates. Fails if deliver hands events over without
// the budget.
func TestStreamTakesRoomBeforeHandingOver(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := &budgetProgress{fakeProgress: newFakeProgress(0x1000), freed: make(chan struct{}, 1)}
	ctx := startBudgetRun(t, f, s, p)
	txn := newTxn(0x2000, 7, 1, 2)
	f.sendTxn(txn)
	if m := ctx.recv(soon); m.Kind != KindBegin {
		t.Fatalf("got %s, want begin", m.Kind)
	}
	// No room: the event waits in the stream, status updates keep flowing.
	for i := range 3 {
		if u := f.nextStatus(soon); u.flush != 0x1000 {
			t.Fatalf("update %d while waiting for room: flush %s", i, u.flush)
		}
	}
	select {
	case m := <-ctx.out:
		t.Fatalf("handed %s over with no room in the budget", m.Kind)
	default:
	}
	p.free(1 << 20)
	m := ctx.recv(soon)
	if m.Kind != KindEvent || m.Event.ID != 1 {
		t.Fatalf("got %s %d, want event 1", m.Kind, m.Event.ID)
	}
	if m.Budgeted != m.Event.Size() || m.Budgeted < EventOverhead {
		t.Fatalf("Budgeted %d, want the event's size %d", m.Budgeted, m.Event.Size())
	}
	if m := ctx.recv(soon); m.Kind != KindEvent || m.Budgeted == 0 {
		t.Fatalf("got %s budgeted %d, want event 2 with room taken", m.Kind, m.Budgeted)
	}
	p.mu.Lock()
	left := p.room
	p.mu.Unlock()
	if want := int64(1<<20) - 2*m.Event.Size(); left != want {
		t.Fatalf("budget left %d, want %d", left, want)
	}
}

func startBudgetRun(t *testing.T, f *fakeServer, s *Stream, p *budgetProgress) *running {
	t.Helper()
	r := &running{t: t, out: make(chan Message, 16), progress: p.fakeProgress, err: make(chan error, 1), started: time.Now()}
	go func() { r.err <- s.Run(t.Context(), r.out, p, p) }()
	t.Cleanup(func() {
		p.finish()
		f.close()
		select {
		case <-r.err:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after the test")
		}
	})
	return r
}
