package replication

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// cappedGate is a Gate whose positions are held downstream first (a
// checkpoint): Confirmable records what the stream wanted and caps it.
type cappedGate struct {
	*fakeProgress
	capAt  atomic.Uint64
	wanted atomic.Uint64
}

func (g *cappedGate) Confirmable(want pglogrepl.LSN) pglogrepl.LSN {
	g.wanted.Store(uint64(want))
	return min(want, pglogrepl.LSN(g.capAt.Load()))
}

// Rule: the stream confirms only what its Gate says may be confirmed, and
// tells the gate what it would confirm (the idle keepalive position too),
// so that the gate can make it confirmable (write a checkpoint at it). Fails
// if the stream confirms its own position without asking the gate.
func TestStreamConfirmsOnlyWhatTheGateAllows(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	g := &cappedGate{fakeProgress: newFakeProgress(0x1000)}
	g.capAt.Store(0x1000)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx, make(chan Message, 16), g, nil) }()
	t.Cleanup(func() {
		cancel()
		g.finish()
		f.close()
		select {
		case <-errc:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after the test")
		}
	})

	// Idle: the stream wants the keepalive's WAL end, the gate holds it at
	// 0/1000.
	f.sendKeepalive(0x5000, true)
	u := f.waitStatus(soon, "the reply to the keepalive", func(u statusUpdate) bool { return u.write >= 0x5000 })
	if u.flush != 0x1000 {
		t.Fatalf("flush %s past the gate's 0/1000", u.flush)
	}
	if got := pglogrepl.LSN(g.wanted.Load()); got != 0x5000 {
		t.Fatalf("the gate was asked for %s, want the keepalive's 0/5000", got)
	}
	// The gate lets it go (the checkpoint holds it now).
	g.capAt.Store(0x5000)
	f.waitStatus(soon, "flush = 0/5000 once the gate allows it", func(u statusUpdate) bool { return u.flush == 0x5000 })
}
