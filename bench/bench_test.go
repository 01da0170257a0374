package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestQuickBenchmark runs the quick matrix (what make bench-quick runs)
// against the stack and checks that the report is complete and well formed:
// every cell and drain present, every measurement taken, no row lost. It
// never asserts timings. BENCH_OUT keeps the output (make bench-quick).
func TestQuickBenchmark(t *testing.T) {
	pg := testenv.Postgres(t) // fails under CI=true when the stack is missing
	k := testenv.Kafka(t)
	st := stack{AdminDSN: pg.AdminDSN, Brokers: k.Brokers}
	bin, self := buildChildren(t, true)
	p := quickPlan()
	rep, err := run(context.Background(), runner{stack: st, bin: bin, self: self, plan: p, logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := rep.write(out); err != nil {
		t.Fatal(err)
	}
	t.Logf("report in %s", out)
	checkReport(t, out, p)
}

// buildChildren builds the programs a run starts, without the race detector
// as make bench builds them: this one (the ceiling and the reader cells)
// and, with outboxd, outboxd.
func buildChildren(t *testing.T, outboxd bool) (bin, self string) {
	t.Helper()
	dir := t.TempDir()
	if outboxd {
		var err error
		if bin, err = buildOutboxd(testenv.RepoRoot(t), dir); err != nil {
			t.Fatal(err)
		}
	}
	self = filepath.Join(dir, "bench")
	// A test runs in its package's folder: bench/, this module's root.
	if out, err := exec.Command("go", "build", "-o", self, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build bench: %v\n%s", err, out)
	}
	return bin, self
}

// checkReport asserts the shape and completeness of a report on disk.
func checkReport(t *testing.T, dir string, p plan) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if rep.Machine.Cores < 1 || rep.Machine.Postgres == "" || rep.Machine.Go == "" {
		t.Errorf("machine info incomplete: %+v", rep.Machine)
	}
	cells := 0
	for _, l := range p.Loads {
		for _, s := range p.Sources {
			if s.at(l) {
				cells += max(1, p.Repeats)
			}
		}
	}
	if len(rep.Latency) != cells {
		t.Errorf("%d latency cells, want %d (sources × loads × rounds)", len(rep.Latency), cells)
	}
	if rep.FloorStart.Records == 0 || rep.FloorStart.P50Ms <= 0 || rep.FloorEnd.Records == 0 || rep.Warmup.Rule == "" {
		t.Errorf("produce floor or warm-up not recorded: start %+v end %+v warm-up %+v", rep.FloorStart, rep.FloorEnd, rep.Warmup)
	}
	for _, l := range p.Loads {
		for _, s := range p.Sources {
			if !s.at(l) {
				continue
			}
			rounds := rep.rounds(s.Name, l)
			if len(rounds) != max(1, p.Repeats) {
				t.Errorf("latency cell %s at %s: %d rounds succeeded, want %d: %v", s.Name, l, len(rounds), max(1, p.Repeats), rep.errors())
				continue
			}
			c := &rounds[0]
			name := fmt.Sprintf("%s at %s", s.Name, l)
			if c.Written == 0 || c.Received != c.Written || c.Missing != 0 || c.Duplicates != 0 {
				t.Errorf("%s: written %d received %d missing %d duplicates %d, want all received once", name, c.Written, c.Received, c.Missing, c.Duplicates)
			}
			if !(0 < c.P50Ms && c.P50Ms <= c.P95Ms && c.P95Ms <= c.P99Ms && c.P99Ms <= c.MaxMs) {
				t.Errorf("%s: percentiles p50 %v p95 %v p99 %v max %v, want 0 < p50 ≤ p95 ≤ p99 ≤ max", name, c.P50Ms, c.P95Ms, c.P99Ms, c.MaxMs)
			}
			if c.CPUSeconds <= 0 || c.PeakRSSMiB <= 0 || c.AchievedRate <= 0 || !cleanExit(s, c.ExitCode) {
				t.Errorf("%s: cpu %v s, rss %v MiB, rate %v, exit %d: want all measured and a clean exit", name, c.CPUSeconds, c.PeakRSSMiB, c.AchievedRate, c.ExitCode)
			}
			if s.Poll && (c.PG.Calls == 0 || c.PG.Rows < int64(c.Written) || c.PG.Blocks == 0) {
				t.Errorf("%s: poller statements %+v, want calls, ≥ %d rows and blocks", name, c.PG, c.Written)
			}
			if c.LateKey != 0 {
				t.Errorf("%s: %d rows arrived after a higher id of their key; one writer per key and one poll worker must keep key order", name, c.LateKey)
			}
		}
	}
	want := append([]string{ceilingName}, names(p.DrainSources)...)
	if len(rep.Drains) != len(want) {
		t.Errorf("%d drains, want %v", len(rep.Drains), want)
	}
	for _, n := range want {
		d := rep.drain(n)
		if d == nil {
			t.Errorf("drain %s missing or failed: %v", n, rep.errors())
			continue
		}
		if d.Rows != p.DrainRows || d.Seconds <= 0 || d.EventsPerSec <= 0 || d.CPUSeconds <= 0 || d.PeakRSSMiB <= 0 {
			t.Errorf("drain %s incomplete: %+v", n, *d)
		}
		if n != ceilingName && d.PctCeiling <= 0 {
			t.Errorf("drain %s: no ratio to the ceiling", n)
		}
	}
	if len(rep.Consumer) != len(p.ConsumerCells)*max(1, p.Repeats) {
		t.Errorf("%d consumer runs, want %d", len(rep.Consumer), len(p.ConsumerCells)*max(1, p.Repeats))
	}
	for _, c := range rep.Consumer {
		if c.Err != "" || c.MessagesPerSec <= 0 || c.Messages != p.ConsumerMessages {
			t.Errorf("consumer run incomplete: %+v", c)
		}
	}
	if len(rep.Targets) == 0 {
		t.Error("no targets evaluated")
	}

	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(append(names(p.Sources), want...), "## End-to-end latency", "## Backlog drain", "## Targets", "bench.png", "Produce round-trip floor", "## Consumer throughput") {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("results.md does not mention %q", s)
		}
	}
	if bytes.Contains(md, []byte("FAILED")) {
		t.Errorf("results.md reports failures:\n%s", md)
	}
	if strings.Count(string(md), "\n| ") < len(rep.Latency)+len(rep.Drains) {
		t.Errorf("results.md has fewer table rows than results")
	}
	f, err := os.Open(filepath.Join(dir, "bench.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("bench.png: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 600 {
		t.Errorf("bench.png is %v, want a full chart", b)
	}
}

func names(ss []source) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}
