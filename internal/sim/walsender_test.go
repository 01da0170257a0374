package sim

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// The walsender is what the simulation's findings stand on: these pin the
// PostgreSQL behaviour it scripts, with the real replication.Stream as its
// client.

// ackGate confirms what the test says is done.
type ackGate struct {
	done chan struct{}
	at   atomic.Uint64
}

func (g *ackGate) Confirmed() pglogrepl.LSN                     { return pglogrepl.LSN(g.at.Load()) }
func (g *ackGate) Confirmable(want pglogrepl.LSN) pglogrepl.LSN { return want }
func (g *ackGate) Done() <-chan struct{}                        { return g.done }

func openStream(t *testing.T, ws *Walsender) (*replication.Stream, chan replication.Message, *ackGate, func() error) {
	t.Helper()
	cfg := streamConfig(ws.ConnString())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := replication.Open(ctx, cfg, zap.NewNop())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	out := make(chan replication.Message, 64)
	g := &ackGate{done: make(chan struct{})}
	g.at.Store(uint64(s.StartLSN()))
	runCtx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(runCtx, out, g, nil) }()
	end := func() error {
		stop()
		close(g.done)
		for range out {
		}
		err := <-errc
		s.Close()
		return err
	}
	return s, out, g, end
}

func next(t *testing.T, out <-chan replication.Message) replication.Message {
	t.Helper()
	select {
	case m, ok := <-out:
		if !ok {
			t.Fatal("the stream ended")
		}
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5 s")
		return replication.Message{}
	}
}

func awaitConfirmed(t *testing.T, ws *Walsender, lsn pglogrepl.LSN) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		c, moved := ws.Confirmed()
		if c >= lsn {
			return
		}
		select {
		case <-moved:
		case <-deadline:
			t.Fatalf("the slot confirmed %s, want %s", c, lsn)
		}
	}
}

// A new session starts at the slot's confirmed position and sends every
// transaction ending above it again, whole: the one it had begun too.
func TestWalsenderSendsAgainFromTheConfirmedPosition(t *testing.T) {
	ws, err := NewWalsender(func(int) ConnFault { return ConnFault{} })
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	row := func(id int64) Row { return Row{ID: id, Key: "k", Topic: Topic, Payload: `{"a": 1}`} }
	t1 := ws.Commit([]Row{row(1)}, 0x100, false)
	t2 := ws.Commit([]Row{row(2), row(3)}, 0, false)

	s, out, g, end := openStream(t, ws)
	if s.StartLSN() != StartLSN {
		t.Fatalf("StartLSN = %s, want %s", s.StartLSN(), StartLSN)
	}
	var ids []int64
	for m := next(t, out); m.Kind != replication.KindCommit || m.Commit.EndLSN != t2.End; m = next(t, out) {
		if m.Kind == replication.KindEvent {
			ids = append(ids, m.Event.ID)
		}
	}
	if len(ids) != 3 {
		t.Fatalf("events %v, want 1 2 3", ids)
	}
	g.at.Store(uint64(t1.End)) // only the first transaction is done
	awaitConfirmed(t, ws, t1.End)
	if err := end(); err != nil {
		t.Fatalf("Run = %v", err)
	}

	s, out, _, end = openStream(t, ws)
	defer end()
	if s.StartLSN() != t1.End {
		t.Fatalf("the second session starts at %s, want the confirmed %s", s.StartLSN(), t1.End)
	}
	if m := next(t, out); m.Kind != replication.KindBegin || m.Begin.FinalLSN != t2.CommitLSN {
		t.Fatalf("first message %v, want the Begin of the second transaction", m.Kind)
	}
	if m := next(t, out); m.Kind != replication.KindEvent || m.Event.ID != 2 {
		t.Fatalf("second message %v (id %d), want event 2", m.Kind, m.Event.ID)
	}
}

// A drop at a WAL message boundary lets the client read every message
// before it: here the Begin and the first row of a transaction, then the
// end of the stream.
func TestWalsenderDropsInsideATransactionAtTheBoundary(t *testing.T) {
	ws, err := NewWalsender(func(n int) ConnFault {
		if n == 0 {
			return ConnFault{Kind: FaultDrop, After: 3} // Begin, Relation, Insert
		}
		return ConnFault{}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws.Commit([]Row{{ID: 1, Key: "k", Topic: Topic, Payload: "{}"}, {ID: 2, Key: "k", Topic: Topic, Payload: "{}"}}, 0, false)
	_, out, _, end := openStream(t, ws)
	if m := next(t, out); m.Kind != replication.KindBegin {
		t.Fatalf("first message %v, want Begin", m.Kind)
	}
	if m := next(t, out); m.Kind != replication.KindEvent || m.Event.ID != 1 {
		t.Fatalf("second message %v, want event 1", m.Kind)
	}
	select {
	case m, ok := <-out:
		if ok {
			t.Fatalf("a %v after the drop, want the end of the stream", m.Kind)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end within 5 s of the drop")
	}
	if err := end(); err == nil {
		t.Fatal("Run = nil after a dropped connection, want an error")
	}
	if f := ws.Fired(); len(f) != 1 {
		t.Fatalf("faults fired: %q, want the one drop", f)
	}
}
