package main

import (
	"runtime/debug"
	"testing"

	"go.uber.org/zap"
)

// run gives Go's collector the soft memory limit the memory bound rests on
// (2 × budget + 24 MiB), unless the operator set GOMEMLIMIT: theirs wins.
func TestRunSetsTheMemoryLimitFromTheBudget(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })

	t.Setenv("GOMEMLIMIT", "")
	setMemoryLimit(16<<20, zap.NewNop())
	if got, want := debug.SetMemoryLimit(-1), int64(2*16<<20+24<<20); got != want {
		t.Fatalf("memory limit %d after setMemoryLimit(16 MiB), want 2 × 16 MiB + 24 MiB = %d", got, want)
	}

	t.Setenv("GOMEMLIMIT", "1GiB")
	debug.SetMemoryLimit(1 << 30) // what the runtime read from it at start
	setMemoryLimit(16<<20, zap.NewNop())
	if got := debug.SetMemoryLimit(-1); got != 1<<30 {
		t.Fatalf("memory limit %d with GOMEMLIMIT=1GiB set, want the operator's 1 GiB kept", got)
	}
}
