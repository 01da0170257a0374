package publisher

import (
	"sync"
	"testing"
)

// What a drain waits for, produced(), never counts an event that the stream
// handed over (or the pipeline dropped) and nothing produced: with the count
// and the hand-over mark in two critical sections, a drain could read one
// such event in between and wait for an acknowledgement that never comes —
// a silent hang of the exactly-once commit (it lost the tail of
// TestRunExactlyOnceKill9UnderLoad once).
func TestLimiterProducedNeverCountsHandedOverEvents(t *testing.T) {
	l := newLimiter(1_000_000, 1<<40)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if l.streamAcquire(100) {
					l.releaseHandedOver(100)
				}
			}
		}()
	}
	bad := 0
	for range 200_000 {
		if l.produced() != 0 {
			bad++
		}
	}
	close(stop)
	wg.Wait()
	if bad > 0 {
		t.Fatalf("produced() counted %d handed-over events nobody produced", bad)
	}
}
