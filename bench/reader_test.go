package main

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestReaderCell: the bare reader (bench-sustained's floor) reads every row
// of a window, in its own process, with the latency measured and the
// walsender's share sampled. It never asserts timings.
func TestReaderCell(t *testing.T) {
	pg := testenv.Postgres(t) // fails under CI=true when the stack is missing
	_, self := buildChildren(t, false)
	p := quickPlan()
	p.Duration = 2 * time.Second
	r := &runner{stack: stack{AdminDSN: pg.AdminDSN}, self: self, plan: p, logf: t.Logf}
	c := r.readerCell(context.Background(), load{Rate: 500, TxRows: 10})
	if c.Err != "" {
		t.Fatal(c.Err)
	}
	if c.Written == 0 || c.Received != c.Written || c.Missing != 0 || c.Duplicates != 0 {
		t.Errorf("written %d received %d missing %d dup %d, want every row once", c.Written, c.Received, c.Missing, c.Duplicates)
	}
	// Latency is commit return → read: the reader can have an event before
	// the writer, descheduled on a loaded machine, sees its COMMIT return,
	// so a percentile may be 0 (a fresh-clone CI run had p50 0 at load 20);
	// a measurement was taken when the maximum is above 0.
	if !(0 <= c.P50Ms && c.P50Ms <= c.P99Ms && c.P99Ms <= c.MaxMs && 0 < c.MaxMs) || c.CPUSeconds <= 0 {
		t.Errorf("p50 %v p99 %v max %v cpu %v s: want ordered percentiles and the reader's CPU", c.P50Ms, c.P99Ms, c.MaxMs, c.CPUSeconds)
	}
	if _, ok := c.CPUShares["walsender"]; !ok {
		t.Errorf("cores %v: want the walsender's share", c.CPUShares)
	}
}
