package sim

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

var (
	seedFlag  = flag.Uint64("sim.seed", 0, "run only this seed (the replay of a failure)")
	seedsFlag = flag.Int("sim.seeds", 0, "run this many seeds from -sim.first instead of TestSim's fixed set")
	firstFlag = flag.Uint64("sim.first", 1000, "the first seed -sim.seeds runs")
	verbose   = flag.Bool("sim.verbose", false, "log the service at info level")
	settleFor = flag.Duration("sim.settle", 30*time.Second, "how long the system may take to settle after the faults stop before the run counts as hung")
	parallel  = flag.Bool("sim.parallel", false, "run the seeds side by side, up to -test.parallel at once: a run spends most of its time waiting on its own timers and faults, not on the CPU")
)

// testSeeds are TestSim's runs under make test: both delivery modes (a
// seed's parity picks it, see Delivery), small enough for -race on 2
// cores. On the code before the pipeline told a cut stream from a clean
// end, seeds 1, 11 and 15 published duplicates and torn transactions in
// exactly-once mode, and seed 3 hung, seed 10 in some runs (a connection
// lost during set-up left the pipeline waiting on a channel nobody
// closed). Seeds 27 and 60 hung on the code before the history read
// (replication.ReadServerHistory) was bounded, when the server accepted its
// connection and then answered nothing.
var testSeeds = []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 27, 60}

func TestSim(t *testing.T) {
	if testing.Short() {
		t.Skip("a simulation of the whole pipeline: seconds per seed")
	}
	seeds := testSeeds
	switch {
	case *seedFlag != 0:
		seeds = []uint64{*seedFlag}
	case *seedsFlag > 0:
		seeds = nil
		for i := range *seedsFlag {
			seeds = append(seeds, *firstFlag+uint64(i))
		}
	}
	var (
		mu     sync.Mutex
		failed []string
	)
	// The seeds run inside one group so that the summary below waits for
	// parallel ones.
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				if *parallel {
					t.Parallel()
				}
				runSeed(t, seed, &mu, &failed)
			})
		}
	})
	if len(failed) > 0 {
		slices.Sort(failed)
		t.Logf("%d of %d seeds failed:\n  %s", len(failed), len(seeds), strings.Join(failed, "\n  "))
	}
}

// runSeed runs one seed and reports it; a failure is also added to failed.
func runSeed(t *testing.T, seed uint64, mu *sync.Mutex, failed *[]string) {
	log := zap.NewNop()
	if *verbose {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	rep := Run(Options{Seed: seed, Sizes: DefaultSizes(), Settle: *settleFor, Log: log})
	if rep.Failed() {
		mu.Lock()
		*failed = append(*failed, fmt.Sprintf("seed %d (%s): %s", seed, rep.Delivery, rep.Violations[0]))
		mu.Unlock()
	}
	t.Logf("%s: %d txns, %d events, %d records read, %d dead-lettered, %d connections, %d instances (fenced %d×), confirmed %s of %s, %s",
		rep.Delivery, rep.Txns, rep.Events, rep.Records, rep.DeadLettered, rep.Connections, rep.Instances, rep.Fenced, rep.Confirmed, rep.WALEnd, rep.Took)
	if !rep.Failed() && !*verbose {
		return
	}
	t.Logf("faults:\n  %s", strings.Join(rep.Fired, "\n  "))
	t.Logf("connections:\n  %s", strings.Join(rep.Ended, "\n  "))
	for _, v := range rep.Violations {
		t.Errorf("seed %d (%s): %s", seed, rep.Delivery, v)
	}
	if rep.Goroutines != "" {
		f, err := os.CreateTemp("", fmt.Sprintf("sim-seed-%d-goroutines-*.txt", seed))
		if err == nil {
			_, _ = f.WriteString(rep.Goroutines)
			f.Close()
			t.Logf("every goroutine at the hang: %s", f.Name())
		}
		t.Logf("goroutines (head):\n%s", head(rep.Goroutines, 12000))
	}
	if rep.Failed() {
		t.Logf("replay: go test ./internal/sim -run TestSim -sim.seed=%d -v", seed)
	}
}

func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n…"
}
