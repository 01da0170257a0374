package slot

import (
	"context"
	"errors"
	"testing"
	"time"
)

// AwaitRelease waits while the holder streams from the slot and returns
// once the holder's connection is gone, without waiting a poll interval.
func TestAwaitReleaseReturnsWhenTheHolderLetsGo(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pg, conn, cfg := newDB(t)
	if _, err := Ensure(ctx, conn, cfg, true); err != nil {
		t.Fatal(err)
	}
	stop := startStreaming(t, pg, cfg)
	var st Status
	waitFor(t, "the slot to become active", func() bool {
		var err error
		if st, err = GetStatus(ctx, conn, cfg); err != nil {
			t.Fatal(err)
		}
		return st.Active
	})

	// Held by another process than the one waited for: returns at once.
	if err := AwaitRelease(ctx, conn, cfg.Slot, int(st.ActivePID)+1, time.Hour); err != nil {
		t.Fatalf("AwaitRelease for a process that does not hold the slot = %v, want nil", err)
	}

	// Held: AwaitRelease keeps waiting until its context ends (on a
	// connection of its own: pgx closes a connection whose query is
	// cancelled).
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := AwaitRelease(short, pg.Conn(t), cfg.Slot, int(st.ActivePID), 10*time.Millisecond)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AwaitRelease while the slot is held = %v, want the context's deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- AwaitRelease(ctx, conn, cfg.Slot, int(st.ActivePID), 10*time.Millisecond) }()
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("AwaitRelease after the holder closed its connection = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("AwaitRelease did not return within 30 s of the holder closing its connection")
	}
}
