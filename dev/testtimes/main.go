// Command testtimes reads `go test -json` output on stdin and prints where a
// test run's time went: the slowest packages and the slowest tests, by wall
// time, with each package's CPU time when the run recorded it (see
// dev/cputime). With -echo it first passes the tests' own output through as
// it arrives, so a run reads as plain `go test` output (CI reads its closing
// lines), and -save keeps the JSON for make test-times.
//
//	go test -json ./... | go run ./dev/testtimes -echo -save .cache/test.json
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string
	elapsed time.Duration
	failed  bool
	// start and end are the package's first and last events, from the
	// run's first event: where it sat on the critical path.
	start, end time.Duration
}

func main() {
	top := flag.Int("top", 25, "how many tests to list")
	cpuFile := flag.String("cpu", "", "file of `test-binary user+sys-seconds` lines written by dev/cputime")
	echo := flag.Bool("echo", false, "print the tests' output as it arrives")
	save := flag.String("save", "", "also write the JSON read to this `file`")
	flag.Parse()
	in := io.Reader(os.Stdin)
	if *save != "" {
		f, err := os.Create(*save)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testtimes:", err)
			os.Exit(1)
		}
		defer f.Close()
		in = io.TeeReader(in, f)
	}
	var out io.Writer
	if *echo {
		out = os.Stdout
	}
	pkgs, tests, err := read(in, out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
	cpu := readCPU(*cpuFile)
	print(os.Stdout, pkgs, tests, cpu, *top)
}

// read collects the pass and fail events; echo (nil: none) gets every
// event's output and every line that is not JSON (build errors).
func read(r io.Reader, echo io.Writer) (pkgs, tests []timing, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	var first time.Time
	started := map[string]time.Duration{}
	// A parallel test runs from its last "cont" (Go released it from the
	// pool of -parallel slots), not from its "run": when it began says
	// whether it could end the package.
	began := map[string]time.Duration{}
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			if echo != nil {
				fmt.Fprintf(echo, "%s\n", sc.Bytes())
			}
			continue // build output and other non-JSON lines
		}
		if echo != nil && e.Output != "" {
			io.WriteString(echo, e.Output)
		}
		if first.IsZero() && !e.Time.IsZero() {
			first = e.Time
		}
		if _, ok := started[e.Package]; !ok && !e.Time.IsZero() {
			started[e.Package] = e.Time.Sub(first)
		}
		if (e.Action == "run" || e.Action == "cont") && e.Test != "" && !e.Time.IsZero() {
			began[e.Package+"\x00"+e.Test] = e.Time.Sub(first)
		}
		if e.Action != "pass" && e.Action != "fail" {
			continue
		}
		t := timing{elapsed: time.Duration(e.Elapsed * float64(time.Second)), failed: e.Action == "fail"}
		switch {
		case e.Test == "":
			t.name = e.Package
			t.start = started[e.Package]
			if !e.Time.IsZero() {
				t.end = e.Time.Sub(first)
			}
			pkgs = append(pkgs, t)
		case !strings.Contains(e.Test, "/"):
			t.name = shortPkg(e.Package) + "." + e.Test
			t.start = began[e.Package+"\x00"+e.Test]
			if !e.Time.IsZero() {
				t.end = e.Time.Sub(first)
			}
			tests = append(tests, t)
		}
	}
	return pkgs, tests, sc.Err()
}

func shortPkg(p string) string { return strings.TrimPrefix(p, "github.com/outboxd/outboxd/") }

// readCPU reads dev/cputime's lines: the test binary's path and its user+sys
// seconds. A missing file is no CPU column.
func readCPU(path string) map[string]float64 {
	out := map[string]float64{}
	if path == "" {
		return out
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		s, err := strconv.ParseFloat(f[1], 64)
		if err == nil {
			out[f[0]] += s
		}
	}
	return out
}

func print(w io.Writer, pkgs, tests []timing, cpu map[string]float64, top int) {
	byTime := func(ts []timing) {
		sort.Slice(ts, func(i, j int) bool { return ts[i].elapsed > ts[j].elapsed })
	}
	byTime(pkgs)
	byTime(tests)
	var total time.Duration
	for _, p := range pkgs {
		total += p.elapsed
	}
	fmt.Fprintf(w, "packages (%d, wall summed %s; (+start → +end) from the run's first event):\n", len(pkgs), total.Round(time.Second))
	for _, p := range pkgs {
		c := ""
		// cputime names the test binary (pkg.test): match it by its base.
		base := p.name[strings.LastIndex(p.name, "/")+1:] + ".test"
		if s, ok := cpu[base]; ok {
			c = fmt.Sprintf("  cpu %7.1fs", s)
		}
		fmt.Fprintf(w, "  %8s%s  (+%s → +%s)  %s%s\n", p.elapsed.Round(100*time.Millisecond), c,
			clock(p.start), clock(p.end), shortPkg(p.name), mark(p.failed))
	}
	n := min(top, len(tests))
	fmt.Fprintf(w, "slowest %d of %d top-level tests (wall; parallel tests overlap; (+start → +end) as for packages):\n", n, len(tests))
	for _, t := range tests[:n] {
		fmt.Fprintf(w, "  %8s  (+%s → +%s)  %s%s\n", t.elapsed.Round(100*time.Millisecond),
			clock(t.start), clock(t.end), t.name, mark(t.failed))
	}
}

// clock is d as minutes:seconds since the run's first event.
func clock(d time.Duration) string {
	d = d.Round(time.Second)
	return fmt.Sprintf("%d:%02d", int(d.Minutes()), int(d.Seconds())%60)
}

func mark(failed bool) string {
	if failed {
		return "  FAIL"
	}
	return ""
}
