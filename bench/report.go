package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// runInfo opens every report (results.json, network.json): what was run,
// where and when.
type runInfo struct {
	Plan     plan      `json:"plan"`
	Machine  machine   `json:"machine"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Warmup   warmup    `json:"warmup"`
}

// newRunInfo is a run of p starting now on r's stack.
func newRunInfo(ctx context.Context, p plan, st stack) runInfo {
	return runInfo{Plan: p, Machine: machineInfo(ctx, st), Started: time.Now().UTC()}
}

// report is everything one run measured.
type report struct {
	runInfo
	FloorStart floor             `json:"floor_start"`
	FloorEnd   floor             `json:"floor_end"`
	Latency    []latencyResult   `json:"latency"`
	Drains     []drainResult     `json:"drains"`
	Consumer   []consumerResult  `json:"consumer"`
	Sustained  []sustainedResult `json:"sustained,omitempty"`
	Targets    []target          `json:"targets"`
}

type machine struct {
	CPU        string  `json:"cpu"`
	Cores      int     `json:"cores"`
	MemoryGiB  float64 `json:"memory_gib"`
	Kernel     string  `json:"kernel"`
	Go         string  `json:"go"`
	Postgres   string  `json:"postgres"`
	PGSettings string  `json:"pg_settings"`
	Kafka      string  `json:"kafka"`
	LoadStart  float64 `json:"load_start"`
	LoadEnd    float64 `json:"load_end"`
}

func (m machine) summary() string {
	return fmt.Sprintf("%d cores (%s), load %.2f", m.Cores, m.CPU, m.LoadStart)
}

func machineInfo(ctx context.Context, s stack) machine {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAvg(), Kafka: "brokers " + strings.Join(s.Brokers, ",")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if sm := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); sm != nil {
			m.CPU = strings.TrimSpace(string(sm[1]))
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if sm := regexp.MustCompile(`(?m)^MemTotal:\s*(\d+)`).FindSubmatch(b); sm != nil {
			fmt.Sscan(string(sm[1]), &kb)
			m.MemoryGiB = float64(kb) / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if root, err := repoRoot(); err == nil {
		if b, err := os.ReadFile(filepath.Join(root, "dev", "versions")); err == nil {
			if sm := regexp.MustCompile(`(?m)^KAFKA_VERSION=(\S+)`).FindSubmatch(b); sm != nil {
				m.Kafka = "Kafka " + string(sm[1]) + " (KRaft, one broker, dev/stack), " + m.Kafka
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(ctx, s.AdminDSN); err == nil {
		defer conn.Close(context.Background())
		_ = conn.QueryRow(ctx, `SELECT version()`).Scan(&m.Postgres)
		_ = conn.QueryRow(ctx, `SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings
			WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers', 'wal_level', 'logical_decoding_work_mem')`).Scan(&m.PGSettings)
	}
	return m
}

// target is one of the goals, as measured.
type target struct {
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// firstErr is the error of a cell's first failed round.
func (r *report) firstErr(src string, l load) string {
	for _, c := range r.Latency {
		if c.Source == src && c.Load == l && c.Err != "" {
			return c.Err
		}
	}
	return "no round ran"
}

func (r *report) drain(src string) *drainResult {
	for i := range r.Drains {
		if r.Drains[i].Source == src && r.Drains[i].Err == "" {
			return &r.Drains[i]
		}
	}
	return nil
}

// evaluate checks the targets against the medians measured.
func (r *report) evaluate() {
	r.Targets = nil
	add := func(goal, measured string, met bool) {
		r.Targets = append(r.Targets, target{goal, measured, met})
	}
	for _, l := range r.Plan.Loads {
		c := r.median("cdc", l)
		if c == nil {
			continue
		}
		p50, p99 := r.stat("cdc", l, func(c latencyResult) float64 { return c.P50Ms }), r.stat("cdc", l, func(c latencyResult) float64 { return c.P99Ms })
		switch {
		case l.Rate == 1000:
			add(fmt.Sprintf("CDC p50 ≤ 1.5 ms and p99 ≤ 6 ms at %s", l),
				fmt.Sprintf("p50 %s ms, p99 %s ms", p50, p99), p50.Median <= 1.5 && p99.Median <= 6)
			add(fmt.Sprintf("CDC publisher peak RSS ≤ 64 MiB at %s", l),
				fmt.Sprintf("%.1f MiB", c.PeakRSSMiB), c.PeakRSSMiB <= 64)
		case l.Rate == 5000 && l.TxRows == 10:
			add(fmt.Sprintf("CDC p99 ≤ 25 ms at %s", l), fmt.Sprintf("p99 %s ms", p99), p99.Median <= 25)
		}
		for _, s := range r.Plan.Sources {
			if !s.Debezium {
				continue
			}
			if dc := r.median(s.Name, l); dc != nil && c.P50Ms > 0 {
				add(fmt.Sprintf("CDC p50 below %s's at %s", s.Name, l),
					fmt.Sprintf("%.2f vs %.2f ms (%.1f×)", c.P50Ms, dc.P50Ms, dc.P50Ms/c.P50Ms), c.P50Ms < dc.P50Ms)
			}
		}
	}
	c, d := r.drain(ceilingName), r.drain("cdc")
	if c != nil && d != nil {
		add("CDC backlog drain ≥ 90% of the no-Kafka ceiling",
			fmt.Sprintf("%.0f%% (%.0f of %.0f ev/s)", d.PctCeiling, d.EventsPerSec, c.EventsPerSec), d.PctCeiling >= 90)
	}
	for _, s := range r.Plan.DrainSources {
		// After start-up, so Debezium's JVM start does not count against it.
		if dz := r.drain(s.Name); s.Debezium && dz != nil && d != nil && dz.SteadyPerSec > 0 {
			add(fmt.Sprintf("CDC backlog drain ≥ 3× %s after start-up", s.Name),
				fmt.Sprintf("%.1f× (%.0f vs %.0f ev/s)", d.SteadyPerSec/dz.SteadyPerSec, d.SteadyPerSec, dz.SteadyPerSec), d.SteadyPerSec >= 3*dz.SteadyPerSec)
		}
	}
}

// errors are the cells that failed.
func (r *report) errors() []error {
	var errs []error
	for _, c := range r.Latency {
		if c.Err != "" {
			errs = append(errs, fmt.Errorf("%s at %s: %s", c.Source, c.Load, c.Err))
		}
	}
	for _, d := range r.Drains {
		if d.Err != "" {
			errs = append(errs, fmt.Errorf("drain %s: %s", d.Source, d.Err))
		}
	}
	for _, c := range r.Consumer {
		if c.Err != "" {
			errs = append(errs, fmt.Errorf("consumer %d partitions batch %d: %s", c.Partitions, c.BatchSize, c.Err))
		}
	}
	return errs
}

// write puts results.json, results.md and bench.png into dir.
func (r *report) write(dir string) error {
	r.evaluate()
	return writeFiles(dir, "results", "bench.png", r, r.markdown, r)
}

// writeFiles puts a report into dir: v as name.json, markdown's text as
// name.md and chart's chart as png.
func writeFiles(dir, name, png string, v any, markdown func() string, chart *report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	img, err := chart.chart()
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return errors.Join(
		os.WriteFile(filepath.Join(dir, name+".json"), append(js, '\n'), 0o644),
		os.WriteFile(filepath.Join(dir, name+".md"), []byte(markdown()), 0o644),
		os.WriteFile(filepath.Join(dir, png), img, 0o644),
	)
}

func (r *report) markdown() string {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# outboxd benchmark: CDC against Debezium and polling (%s run)\n\n", r.Plan.Name)
	p("Run %s, %s. Generated by `bench/` (`make bench`); numbers from one run on one machine, shared with other work: read the ratios, and the load average next to each row.\n\n",
		r.Started.Format("2006-01-02 15:04 MST"), r.Finished.Sub(r.Started).Round(time.Second))
	m := r.Machine
	p("- Machine: %d cores, %s, %.1f GiB RAM, Linux %s, %s; load average %.2f at start, %.2f at end\n", m.Cores, m.CPU, m.MemoryGiB, m.Kernel, m.Go, m.LoadStart, m.LoadEnd)
	p("- PostgreSQL: %s (%s)\n", m.Postgres, m.PGSettings)
	p("- %s; topics of %d partitions, replication factor 1, producer acks=all, idempotent\n", m.Kafka, r.Plan.Partitions)
	p("- Load: %s per cell after a warm-up; %d aggregates, each written by one of the writer connections; payload ~%d bytes of JSON; autocommit INSERT ... RETURNING per transaction\n\n",
		r.Plan.Duration, r.Plan.Aggregates, r.Plan.PayloadBytes)
	p("![latency and drain](bench.png)\n\n")

	p("- Broker warm-up before the first cell: %.0f s, stable %v. Rule: %s.\n", r.Warmup.Seconds, r.Warmup.Stable, r.Warmup.Rule)
	p("- **Produce round-trip floor** (one record, acks=all, to the same broker, nothing else running): at the start %s; at the end %s. No publisher can deliver faster than this on this machine.\n\n", r.FloorStart, r.FloorEnd)
	if len(r.Latency) > 0 {
		p("## End-to-end latency (writer's commit return → consumer receipt, one clock)\n\n")
		p("Median over %d rounds with (min–max); each round runs a load's sources in a rotated order. Produce floor: p50 %.2f / p99 %.2f ms.\n\n", max(1, r.Plan.Repeats), r.FloorStart.P50Ms, r.FloorStart.P99Ms)
		p("| load | source | rounds | achieved ev/s | p50 ms | p99 ms | max ms | publisher CPU ms/1k ev | publisher peak RSS MiB | PG backend CPU ms/1k ev | PG blocks/1k ev | late: partition / key | missing / dup |\n")
		p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, l := range r.Plan.Loads {
			for _, s := range r.Plan.Sources {
				if !s.at(l) {
					continue
				}
				m := r.median(s.Name, l)
				if m == nil {
					p("| %s | %s | 0 | FAILED: %s |||||||||\n", l, s.Name, mdEscape(r.firstErr(s.Name, l)))
					continue
				}
				st := func(f func(latencyResult) float64) spread { return r.stat(s.Name, l, f) }
				p("| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %.1f | %.0f | %d / %d | %d / %d |\n",
					l, s.Name, len(r.rounds(s.Name, l)), m.AchievedRate,
					st(func(c latencyResult) float64 { return c.P50Ms }), st(func(c latencyResult) float64 { return c.P99Ms }),
					st(func(c latencyResult) float64 { return c.MaxMs }), st(func(c latencyResult) float64 { return c.CPUMsPer1k }),
					st(func(c latencyResult) float64 { return c.PeakRSSMiB }),
					m.PGCPUMsPer1k, m.PGBlocksPer1k, m.LatePartition, m.LateKey, m.Missing, m.Duplicates)
			}
		}
		p("\n")
		p("### Latency ratios in this run (other p50 ÷ outboxd CDC p50, medians)\n\n| load |")
		var others []source
		for _, s := range r.Plan.Sources {
			if s.Poll || s.Debezium {
				others = append(others, s)
				p(" %s ÷ cdc |", s.Name)
			}
		}
		p("\n|---|%s\n", strings.Repeat("--:|", len(others)))
		for _, l := range r.Plan.Loads {
			c := r.median("cdc", l)
			p("| %s |", l)
			for _, s := range others {
				if pc := r.median(s.Name, l); c != nil && pc != nil && c.P50Ms > 0 {
					p(" %.1f× |", pc.P50Ms/c.P50Ms)
				} else {
					p(" – |")
				}
			}
			p("\n")
		}
		p("\n")
		p("### Every round\n\n")
		p("| load | source | round | writers | achieved ev/s | p50 ms | p95 ms | p99 ms | max ms | CPU ms/1k ev | peak RSS MiB | PG WAL B/ev | missing / dup | load avg |\n")
		p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, c := range r.Latency {
			if c.Err != "" {
				p("| %s | %s | %d | %d | FAILED: %s ||||||||||\n", c.Load, c.Source, c.Round, c.Writers, mdEscape(c.Err))
				continue
			}
			p("| %s | %s | %d | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.0f | %d / %d | %.2f |\n",
				c.Load, c.Source, c.Round, c.Writers, c.AchievedRate, c.P50Ms, c.P95Ms, c.P99Ms, c.MaxMs, c.CPUMsPer1k, c.PeakRSSMiB,
				c.PGWALBPerEvent, c.Missing, c.Duplicates, c.LoadAfter)
		}
		p("\n")
	}
	if len(r.Drains) > 0 {
		p("## Backlog drain (%d rows preloaded in %d-row transactions)\n\n", r.Plan.DrainRows, r.Plan.DrainTxRows)
		p("| source | seconds | events/s | start-up s | events/s after start-up | %% of ceiling | CPU ms/1k ev | peak RSS MiB | PG backend CPU s | PG blocks | load avg |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
		for _, d := range r.Drains {
			if d.Err != "" {
				p("| %s | FAILED: %s ||||||||||\n", d.Source, mdEscape(d.Err))
				continue
			}
			pct := "–"
			if d.Source != ceilingName {
				pct = fmt.Sprintf("%.0f%%", d.PctCeiling)
			} else if len(d.Runs) > 1 {
				pct = fmt.Sprintf("best of %v ev/s", d.Runs)
			}
			steady := d.SteadyPerSec
			if steady == 0 {
				steady = d.EventsPerSec // the ceiling: no start-up to take off
			}
			p("| %s | %.2f | %.0f | %.2f | %.0f | %s | %.2f | %.1f | %.2f | %d | %.2f |\n",
				d.Source, d.Seconds, d.EventsPerSec, d.StartupSeconds, steady, pct, d.CPUMsPer1k, d.PeakRSSMiB, d.PGCPUSeconds, d.PG.Blocks, d.LoadAfter)
		}
		p("\n")
	}
	if len(r.Sustained) > 0 {
		p("## Sustained rate (outboxd CDC, p99 commit → Kafka < 100 ms over a %s window)\n\n", r.Plan.SustainedWindow)
		p("| transaction | highest rate kept up | its p50 / p99 ms | first rate that failed | why |\n|---|--:|--:|--:|---|\n")
		for _, x := range r.Sustained {
			best, bp, fail := "none", "–", "–"
			if x.Best != nil {
				best = fmt.Sprintf("%.0f ev/s", x.Best.AchievedRate)
				bp = fmt.Sprintf("%.2f / %.2f", x.Best.P50Ms, x.Best.P99Ms)
			}
			if x.Failed != nil {
				fail = fmt.Sprintf("%d ev/s", x.Failed.Load.Rate)
			}
			p("| %d row/tx | %s | %s | %s | %s |\n", x.TxRows, best, bp, fail, mdEscape(x.Bottleneck))
		}
		p("\n")
		if r.Plan.SustainedReader {
			p("The bare replication reader (receive + decode + confirm, no Kafka; p99 commit → read < 100 ms) at each rate of outboxd's search, in the window just before outboxd's; its best is the highest of those rates it kept up with (if it kept up with all, the most outboxd's search tried), and outboxd's best as a fraction of it (the target: ≥ 90%%):\n\n")
			p("| transaction | reader: highest rate kept up | its p50 / p99 ms | first rate that failed | walsender cores there | outboxd ÷ reader |\n|---|--:|--:|--:|--:|--:|\n")
			for _, x := range r.Sustained {
				rd := x.Reader
				if rd == nil {
					continue
				}
				best, bp, fail, ws, frac := "none", "–", "–", "–", "–"
				if rd.Best != nil {
					best, bp = fmt.Sprintf("%d ev/s", rd.Best.Load.Rate), fmt.Sprintf("%.2f / %.2f", rd.Best.P50Ms, rd.Best.P99Ms)
				}
				if rd.Failed != nil {
					fail, ws = fmt.Sprintf("%d ev/s", rd.Failed.Load.Rate), fmt.Sprintf("%.2f", rd.Failed.CPUShares["walsender"])
				}
				if x.Fraction > 0 {
					frac = fmt.Sprintf("%.0f%%", 100*x.Fraction)
				}
				p("| %d row/tx | %s | %s | %s | %s | %s |\n", x.TxRows, best, bp, fail, ws, frac)
			}
			p("\n")
		}
	}
	if len(r.Consumer) > 0 {
		p("## Consumer throughput (package consumer, dedup in the handler's transaction)\n\n")
		p("%d messages preloaded per run; the handler inserts each message into a table; from Run's start (group join included) until all are processed. Median over the rounds with (min–max).\n\n", r.Plan.ConsumerMessages)
		p("| partitions | batch | messages/s | per partition |\n|--:|--:|--:|--:|\n")
		for _, c := range r.Plan.ConsumerCells {
			var v []float64
			for _, x := range r.Consumer {
				if x.Partitions == c.Partitions && x.BatchSize == c.Batch && x.Err == "" {
					v = append(v, x.MessagesPerSec)
				}
			}
			if len(v) == 0 {
				p("| %d | %d | FAILED | |\n", c.Partitions, c.Batch)
				continue
			}
			sp := spreadOf(v)
			p("| %d | %d | %.0f (%.0f–%.0f) | %.0f |\n", c.Partitions, c.Batch, sp.Median, sp.Min, sp.Max, sp.Median/float64(c.Partitions))
		}
		p("\n")
	}
	if len(r.Targets) > 0 {
		p("## Targets\n\n| goal | measured | met |\n|---|---|---|\n")
		for _, t := range r.Targets {
			met := "no"
			if t.Met {
				met = "yes"
			}
			p("| %s | %s | %s |\n", t.Goal, t.Measured, met)
		}
		p("\n")
	}
	p("## How to read it\n\n")
	p("- **Latency** is measured in one process: each writer stamps the time its autocommit INSERT returned, the Kafka consumer (sarama, every partition) stamps each record on arrival; latency = arrival − commit return. It includes the consumer's fetch. *negative* (arrived before the commit returned) would be counted as 0.\n")
	p("- **Publisher CPU** is user+system time of the outboxd process over the measured window (/proc/PID/stat), per 1,000 events; **peak RSS** is its VmHWM.\n")
	p("- **PostgreSQL cost**: *PG backend CPU* is the CPU of the server processes serving the publisher (the walsender under CDC, the poll connections under polling), from /proc; *blocks* and *WAL* are pg_stat_statements over the poller's statements (CDC runs none: it reads WAL, not tables).\n")
	p("- **late: partition / key** counts records that reached Kafka after a record with a higher outbox id on the same partition / of the same key. Writers run concurrently, so transactions commit out of id order; CDC publishes in commit order, polling in id order within one poll and in commit order across polls. Each key has one writer, so per key, commit order is id order and *key* must be 0 with one poll worker.\n")
	p("- **Drain**: the backlog is preloaded, then the publisher starts; seconds run from process start until Kafka's high watermarks hold every row. The **ceiling** is the replication reader (replication.Open, Stream.Run: receive + decode) confirming as it reads, with no Kafka, in a process of its own, from process start to the last event. Polling's interval does not matter while every poll returns a full batch.\n")
	return b.String()
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
