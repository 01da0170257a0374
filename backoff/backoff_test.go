package backoff

import (
	"context"
	"testing"
	"time"
)

func TestBackoffDoublesUpToTheCapAndResetsAfterAHealthyRun(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next(0))
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		hi := want[i] * time.Millisecond
		if got[i] > hi || got[i] < hi*8/10 {
			t.Fatalf("backoffs %v, want %v ms less at most 20%% jitter", got, want)
		}
	}
	if d := b.Next(3 * time.Second); d > 100*time.Millisecond || d < 80*time.Millisecond {
		t.Fatalf("after a 3 s run the backoff is %s, want it back at 100ms", d)
	}
}

func TestSleepReturnsFalseWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a cancelled context returned true")
	}
	if !Sleep(context.Background(), 0) {
		t.Fatal("Sleep(0) on a live context returned false")
	}
}
