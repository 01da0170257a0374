package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// childEnv selects a child mode of this program (or of its test binary).
const childEnv = "OUTBOXD_BENCH_CHILD"

// ceilingOutput is what the ceiling child prints, as one JSON line.
type ceilingOutput struct {
	Events  int     `json:"events"`
	Seconds float64 `json:"seconds"` // from process start to the last event
}

// confirmAsRead is a replication.Gate that confirms every transaction as
// soon as its commit is read: the stream with no sink at all (and no
// budget: Run's is nil).
type confirmAsRead struct {
	lsn  atomic.Uint64
	done chan struct{}
}

func (c *confirmAsRead) Confirmed() pglogrepl.LSN { return pglogrepl.LSN(c.lsn.Load()) }
func (c *confirmAsRead) Done() <-chan struct{}    { return c.done }

// Confirmable is all that was read: nothing downstream holds a position.
func (c *confirmAsRead) Confirmable(want pglogrepl.LSN) pglogrepl.LSN { return want }

// ceilingMain reads want events from the slot with the replication reader
// (replication.Open, Stream.Run: receive, decode) and no Kafka, and prints
// how long it took. The ceiling any CDC publisher built on it can reach.
func ceilingMain(args []string) int {
	started := time.Now()
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	dsn := fs.String("dsn", "", "database DSN")
	slotName := fs.String("slot", "", "slot")
	pub := fs.String("publication", "", "publication")
	want := fs.Int("want", 0, "events to read")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s, err := replication.Open(ctx, replication.StreamConfig{
		ConnString: *dsn, Slot: *slotName, Publication: *pub, StatusInterval: time.Second,
		Decoder: replication.DecoderConfig{Columns: replication.DefaultColumns()},
	}, zap.NewNop())
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		return 1
	}
	defer s.Close()
	prog := &confirmAsRead{done: make(chan struct{})}
	out := make(chan replication.Message, 1024)
	readCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(readCtx, out, prog, nil) }()
	n := 0
	var last time.Time
	for m := range out {
		switch m.Kind {
		case replication.KindEvent:
			n++
			if n == *want {
				last = time.Now()
				stop()
			}
		case replication.KindCommit:
			prog.lsn.Store(uint64(m.Commit.EndLSN))
		}
	}
	close(prog.done)
	if err := <-runErr; err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		return 1
	}
	if n < *want {
		fmt.Fprintf(os.Stderr, "ceiling: read %d events, want %d\n", n, *want)
		return 1
	}
	b, _ := json.Marshal(ceilingOutput{Events: n, Seconds: last.Sub(started).Seconds()})
	fmt.Println(string(b))
	return 0
}
