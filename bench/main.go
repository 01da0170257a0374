// Command bench measures outboxd's CDC publisher against the polling
// publisher on the local stack, side by side in one run: end-to-end latency
// at fixed loads, CPU and memory of the publisher process, what each costs
// PostgreSQL, and how fast each drains a backlog, next to the ceiling of the
// replication reader with no Kafka. See bench/README.md.
//
//	bin/bench [-quick] [-out bench/results] [-outboxd bin/outboxd]
//
// bench/ is a module of its own: make bench builds bin/bench from this
// folder (go build -C bench), and runs it from the repo root.
//
// It needs the dev stack (dev/stack up, or OUTBOXD_PG_DSN and
// OUTBOXD_KAFKA_BROKERS) and writes results.json, results.md and bench.png to
// -out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	switch os.Getenv(childEnv) {
	case "ceiling":
		os.Exit(ceilingMain(os.Args[1:]))
	case "reader":
		os.Exit(readerMain(os.Args[1:]))
	}
	if err := benchMain(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func benchMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "the reduced matrix (smoke check, < 3 min)")
	out := fs.String("out", "", "folder for results.json, results.md and bench.png (default bench/results, or bench/results/quick with -quick)")
	bin := fs.String("outboxd", "", "outboxd binary to measure (default: go build ./cmd/outboxd into a temporary folder)")
	duration := fs.Duration("duration", 0, "override the time each latency cell writes")
	drainRows := fs.Int("drain-rows", 0, "override the backlog size")
	sources := fs.String("sources", "", "comma-separated sources instead of the plan's: cdc, cdc-linger-DURATION, poll-DURATION, poll-DURATION-bBATCH")
	loads := fs.String("loads", "", "comma-separated loads to run as RATExROWS, e.g. 1000x1,5000x10 (default all)")
	only := fs.String("only", "", "run only latency (\"latency\"), the drains (\"drain\") or the consumer (\"consumer\")")
	pprofDir := fs.String("pprof", "", "write a CPU profile of outboxd from the middle of each latency window to this folder (outboxd --pprof)")
	profile := fs.String("profile", "", "instead of the matrix: profile the CDC and poll drains in-process, writing pprof files to this folder")
	network := fs.Bool("network", false, "the network matrix (make bench-network): every cell at each -rtts through the proxy of -proxy-api; writes network.{md,json,png}")
	proxyAPI := fs.String("proxy-api", "", "with -network: the proxy's HTTP API (dev/stack proxy-start's DIR/api)")
	proxyBrokers := fs.String("proxy-brokers", "", "with -network: the broker address behind the proxy, which the publishers bootstrap from")
	rtts := fs.String("rtts", "", "with -network: comma-separated round trips instead of the plan's, e.g. 0,1ms,5ms")
	chart := fs.String("chart", "", "instead of measuring: read this results.json (or network.json) and draw its bench.png (network.png) again")
	rewrite := fs.String("rewrite", "", "instead of measuring: read this results.json (or network.json) and write its .md and .png again (same data)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *chart != "" || *rewrite != "" {
		return redraw(*chart+*rewrite, *rewrite != "")
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	st, err := stackFromEnv()
	if err != nil {
		return err
	}
	p := fullPlan()
	if *quick {
		p = quickPlan()
	}
	if *network {
		p = networkPlan()
		if *quick {
			p = networkQuickPlan()
		}
		if *rtts != "" {
			p.RTTs = nil
			for _, f := range strings.Split(*rtts, ",") {
				f = strings.TrimSpace(f)
				if f == "0" {
					f = "0s"
				}
				d, err := time.ParseDuration(f)
				if err != nil || d < 0 {
					return fmt.Errorf("-rtts %q: want durations such as 0,1ms,5ms", f)
				}
				p.RTTs = append(p.RTTs, d)
			}
		}
		if *proxyAPI == "" || *proxyBrokers == "" {
			return errors.New("-network needs -proxy-api and -proxy-brokers (make bench-network starts the proxy)")
		}
		st.PubBrokers = strings.Split(*proxyBrokers, ",")
	}
	if *duration > 0 {
		p.Duration = *duration
	}
	if *drainRows > 0 {
		p.DrainRows = *drainRows
	}
	if *sources != "" {
		p.Sources, p.DrainSources = nil, nil
		for _, n := range strings.Split(*sources, ",") {
			src, err := parseSource(strings.TrimSpace(n))
			if err != nil {
				return err
			}
			p.Sources, p.DrainSources = append(p.Sources, src), append(p.DrainSources, src)
		}
	}
	if *loads != "" {
		var ls []load
		for _, f := range strings.Split(*loads, ",") {
			var l load
			if _, err := fmt.Sscanf(strings.TrimSpace(f), "%dx%d", &l.Rate, &l.TxRows); err != nil || l.Rate < 1 || l.TxRows < 1 {
				return fmt.Errorf("-loads %q: want RATExROWS, e.g. 1000x10", f)
			}
			ls = append(ls, l)
		}
		p.Loads = ls
	}
	switch *only {
	case "":
	case "latency":
		p.DrainSources, p.DrainRows, p.ConsumerCells = nil, 0, nil
	case "drain":
		p.Loads, p.ConsumerCells = nil, nil
	case "consumer":
		p.Loads, p.DrainSources, p.DrainRows = nil, nil, 0
	case "sustained":
		p.Loads, p.DrainSources, p.DrainRows, p.ConsumerCells = nil, nil, 0, nil
		p.Sustained = []sustainedSpec{{TxRows: 1, Start: 2000}, {TxRows: 100, Start: 20000}}
		p.SustainedWindow = 60 * time.Second
		p.SustainedReader = true
		if *duration > 0 {
			p.SustainedWindow = *duration
		}
	case "hot":
		p.Loads, p.DrainSources, p.DrainRows, p.ConsumerCells = nil, nil, 0, nil
	default:
		return fmt.Errorf("-only %q: use latency, drain, consumer, sustained or (with -network) hot", *only)
	}
	if *only != "" && *only != "hot" {
		p.Hot = nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if *profile != "" {
		return profileDrains(ctx, st, p, *profile, logf)
	}
	if *out == "" {
		*out = filepath.Join(root, "bench", "results")
		if *quick {
			*out = filepath.Join(*out, "quick")
		}
	}
	if *bin == "" {
		tmp, err := os.MkdirTemp("", "outboxd-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if *bin, err = buildOutboxd(root, tmp); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *network {
		nr, err := runner{stack: st, bin: *bin, self: self, plan: p, logf: logf, pprofDir: *pprofDir, setRTT: httpRTT(*proxyAPI)}.network(ctx)
		if err != nil {
			return err
		}
		if err := nr.write(*out); err != nil {
			return err
		}
		logf("wrote %s", *out)
		if errs := nr.errors(); len(errs) > 0 {
			return fmt.Errorf("%d cells failed: %w", len(errs), errors.Join(errs...))
		}
		return nil
	}
	rep, err := run(ctx, runner{stack: st, bin: *bin, self: self, plan: p, logf: logf, pprofDir: *pprofDir})
	if err != nil {
		return err
	}
	if err := rep.write(*out); err != nil {
		return err
	}
	logf("wrote %s", *out)
	if errs := rep.errors(); len(errs) > 0 {
		return fmt.Errorf("%d cells failed: %w", len(errs), errors.Join(errs...))
	}
	return nil
}

// buildOutboxd compiles ./cmd/outboxd (without the race detector: it is
// what is measured) into dir.
func buildOutboxd(root, dir string) (string, error) {
	bin := filepath.Join(dir, "outboxd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/outboxd")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/outboxd: %w", err)
	}
	return bin, nil
}

// run measures every latency cell, then the drains.
func run(ctx context.Context, r runner) (*report, error) {
	rep := &report{runInfo: newRunInfo(ctx, r.plan, r.stack)}
	findPostmaster(ctx, r.stack)
	r.logf("bench %s: %d sources × %d loads × %s × %d rounds, then a %d-row backlog; %s",
		r.plan.Name, len(r.plan.Sources), len(r.plan.Loads), r.plan.Duration, max(1, r.plan.Repeats), r.plan.DrainRows, rep.Machine.summary())
	// A broker JVM that has just started is slow for a minute or so: warm
	// it until its round trip is stable, and record the floor.
	var err error
	if rep.Warmup, rep.FloorStart, err = warmBroker(ctx, r.stack, r.plan.WarmMin, r.plan.WarmMax, r.logf); err != nil {
		return nil, fmt.Errorf("broker warm-up: %w", err)
	}
	// Interleave sources per load so machine noise spreads over all of
	// them, and rotate their order each round (A B C, B C A, ...).
	for round := range max(1, r.plan.Repeats) {
		for _, l := range r.plan.Loads {
			var srcs []source
			for _, s := range r.plan.Sources {
				if s.at(l) {
					srcs = append(srcs, s)
				}
			}
			for i := range srcs {
				s := srcs[(i+round)%len(srcs)]
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				c := r.latencyCell(ctx, s, l)
				c.Round = round + 1
				rep.Latency = append(rep.Latency, c)
			}
		}
	}
	if r.plan.DrainRows > 0 && len(r.plan.DrainSources) > 0 {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.logf("backlog drain, %d rows:", r.plan.DrainRows)
		rep.Drains = r.drains(ctx)
	}
	if len(r.plan.Sustained) > 0 {
		sr := r
		sr.plan.Duration = r.plan.SustainedWindow
		for _, sp := range r.plan.Sustained {
			var res sustainedResult
			if r.plan.SustainedReader {
				r.logf("sustained rate, %d-row transactions, windows of %s, from %d ev/s; at each rate the bare reader (no Kafka), then outboxd:", sp.TxRows, sr.plan.Duration, sp.Start)
				res = sr.sustainedPaired(ctx, sp.TxRows, sp.Start)
				r.logf("  → reader, at the same rates: %s", res.Reader.summary())
			} else {
				r.logf("sustained rate, %d-row transactions, windows of %s, from %d ev/s:", sp.TxRows, sr.plan.Duration, sp.Start)
				res = sr.sustained(ctx, sp.TxRows, sp.Start)
			}
			r.logf("  → %s", res.summary())
			rep.Sustained = append(rep.Sustained, res)
		}
	}
	if r.plan.ConsumerMessages > 0 && len(r.plan.ConsumerCells) > 0 {
		r.logf("consumer throughput, %d messages a run:", r.plan.ConsumerMessages)
		for round := range max(1, r.plan.Repeats) {
			for i := range r.plan.ConsumerCells {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				c := r.plan.ConsumerCells[(i+round)%len(r.plan.ConsumerCells)]
				res, err := consumerThroughput(ctx, r.stack, c.Partitions, r.plan.ConsumerMessages, c.Batch, func(string, ...any) {})
				if err != nil {
					r.logf("  consumer %d partitions, batch %d: %v", c.Partitions, c.Batch, err)
				} else {
					r.logf("  consumer %d partitions, batch %3d: %8.0f msg/s", c.Partitions, c.Batch, res.MessagesPerSec)
				}
				rep.Consumer = append(rep.Consumer, res)
			}
		}
	}
	if rep.FloorEnd, err = measureFloor(r.stack); err != nil {
		r.logf("produce floor at the end: %v", err)
	}
	r.logf("produce floor at the end: %s", rep.FloorEnd)
	rep.Finished = time.Now().UTC()
	rep.Machine.LoadEnd = loadAvg()
	return rep, nil
}
