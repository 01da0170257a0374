package memory

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// memCell is one cell of README's memory table.
type memCell struct {
	size, rows int
	budget     int64 // 0: the default (64 MiB)
}

func (c memCell) name() string {
	b := "default"
	if c.budget != 0 {
		b = fmt.Sprintf("%dMiB", c.budget>>20)
	}
	return fmt.Sprintf("%dB/%s", c.size, b)
}

// limit is README's bound for the cell: 2 × budget + 64 MiB (see memBound).
func (c memCell) limit() int64 {
	b := c.budget
	if b == 0 {
		b = 64 << 20
	}
	return 2*b + 64<<20
}

// memCells are the event sizes of the table, each with enough rows to fill
// the default budget several times (200 B events are bounded by
// --max-in-flight-events first). OUTBOXD_BENCH_MEMORY_CELLS, a
// comma-separated list of cell names (e.g. 900000B/16MiB,1000B/default),
// keeps only those.
func memCells() []memCell {
	keep := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("OUTBOXD_BENCH_MEMORY_CELLS"), ",") {
		if n != "" {
			keep[n] = true
		}
	}
	var cs []memCell
	for _, s := range []struct{ size, rows int }{{200, 100_000}, {1_000, 100_000}, {10_000, 20_000}, {100_000, 3_000}, {900_000, 1_000}} {
		for _, b := range []int64{0, 16 << 20} {
			c := memCell{size: s.size, rows: s.rows, budget: b}
			if len(keep) == 0 || keep[c.name()] {
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// memRun is one outboxd of the table.
type memRun struct {
	c      memCell
	e      *e2e.Env
	d      *e2e.Daemon
	during int64 // peak RSS when Kafka came back (stopped runs)
	peak   int64
	file   int64 // the executable's resident pages at the end
	took   time.Duration
}

func startMemRun(t *testing.T, c memCell, brokers []string) *memRun {
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: brokers, Topic: testenv.UniqueName("memtab"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, brokers, e.Topic, 6)
	e.Migrate()
	args := e.Args()
	if c.budget != 0 {
		args = append(args, "--max-in-flight-bytes", strconv.FormatInt(c.budget, 10))
	}
	p := testproc.StartEnv(t, testproc.CleanEnv(), noRaceBinary(t), args...)
	d := e2e.NewDaemon(t, p)
	d.WaitLog("streaming", 2*time.Minute)
	// One event through first: the session has its producer.
	bigRows(e, 1, 100, 1, 1)
	e2e.WaitFor(t, 2*time.Minute, func() bool { return e2e.EndOffsets(brokers, e.Topic) >= 1 })
	return &memRun{c: c, e: e, d: d}
}

func (r *memRun) write() {
	bigRows(r.e, r.c.rows, r.c.size, max(1, min(100, 10_000_000/r.c.size)), 200)
}

func (r *memRun) wait(t *testing.T, start time.Time) {
	e2e.WaitFor(t, 10*time.Minute, func() bool { return e2e.EndOffsets(r.e.Brokers, r.e.Topic) >= int64(r.c.rows+1) })
	r.took = time.Since(start)
	r.peak = r.d.PeakRSS()
	r.file, _ = testproc.ResidentFile(r.d.PID())
	r.d.Stop()
}

// TestMemoryTable measures README's memory table: peak RSS of outboxd
// (without -race) publishing events of 200 B to 900 KB, with Kafka up and
// with Kafka stopped for 60 s while they are committed, at the default
// budget and at 16 MiB. Run by `make bench-memory` (OUTBOXD_BENCH_MEMORY=1);
// skipped otherwise. OUTBOXD_BENCH_MEMORY_OUTAGE overrides the 60 s.
func TestMemoryTable(t *testing.T) {
	if os.Getenv("OUTBOXD_BENCH_MEMORY") == "" {
		t.Skip("set OUTBOXD_BENCH_MEMORY=1 (make bench-memory) to measure the memory table")
	}
	outage := 60 * time.Second
	if v := os.Getenv("OUTBOXD_BENCH_MEMORY_OUTAGE"); v != "" {
		var err error
		if outage, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	cells := memCells()
	var mu sync.Mutex
	var lines []string
	add := func(r *memRun, kafka string) {
		mu.Lock()
		defer mu.Unlock()
		during := "–"
		if r.during > 0 {
			during = fmt.Sprintf("%d", r.during>>20)
		}
		lines = append(lines, fmt.Sprintf("| %s | %s | %d | %s | %d | %d | %d | %.0f s |",
			r.c.name(), kafka, r.c.rows, during, r.peak>>20, r.file>>20, r.c.limit()>>20, r.took.Seconds()))
	}

	// Kafka up: the shared broker, one cell after another (each alone on
	// the machine's cores).
	k := testenv.Kafka(t)
	for _, c := range cells {
		t.Run("up/"+c.name(), func(t *testing.T) { // its slot and database go at its end
			r := startMemRun(t, c, k.Brokers)
			start := time.Now()
			r.write()
			r.wait(t, start)
			add(r, "up")
		})
	}

	// Kafka stopped: a private broker per group of up to 5 cells (the
	// shared PostgreSQL has 20 slots for every test), stopped while their
	// rows are committed, started again after the outage.
	for i := 0; i < len(cells); i += 5 {
		t.Run(fmt.Sprintf("stopped/%d", i/5), func(t *testing.T) {
			memOutage(t, testenv.StartKafka(t), cells[i:min(i+5, len(cells))], outage, add)
		})
	}
	sort.Strings(lines)
	t.Logf("\n| event size / budget | Kafka | events | peak RSS while stopped (MiB) | peak RSS (MiB) | of which at most the executable's pages (MiB) | bound 2×budget+64 MiB | to publish |\n|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(lines, "\n"))
}

// memOutage runs cells on ks, stopped for outage while their rows are
// committed.
func memOutage(t *testing.T, ks *testenv.KafkaServer, cells []memCell, outage time.Duration, add func(*memRun, string)) {
	var runs []*memRun
	for _, c := range cells {
		runs = append(runs, startMemRun(t, c, ks.Brokers))
	}
	ks.Stop()
	down := time.Now()
	for _, r := range runs {
		r.write()
	}
	for time.Since(down) < outage {
		for _, r := range runs {
			if r.d.Exited() {
				t.Fatalf("%s: outboxd exited (%d) while Kafka was down", r.c.name(), r.d.Code)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, r := range runs {
		r.during = r.d.PeakRSS()
	}
	ks.Start()
	up := time.Now()
	for _, r := range runs {
		r.wait(t, up)
		add(r, fmt.Sprintf("stopped %s", outage))
	}
	for _, r := range runs {
		if r.peak > r.c.limit() {
			t.Errorf("%s: peak RSS %d MiB over the bound %d MiB", r.c.name(), r.peak>>20, r.c.limit()>>20)
		}
	}
}
