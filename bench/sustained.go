package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/testproc"
)

// The sustained rate: the highest write rate outboxd keeps up
// with, p99 commit → Kafka under 100 ms over a whole window, per
// transaction shape, found by doubling the rate until a window fails and
// then halving the gap twice; and at the first failing rate, where the
// machine's CPU went.

// sustainedResult is the search for one transaction shape.
type sustainedResult struct {
	TxRows int `json:"tx_rows"`
	// Best is the highest rate that kept up (nil if none did); Failed the
	// lowest that did not.
	Best   *latencyResult  `json:"best,omitempty"`
	Failed *latencyResult  `json:"failed,omitempty"`
	Steps  []latencyResult `json:"steps"`
	// Bottleneck says why Failed failed, from its numbers.
	Bottleneck string `json:"bottleneck"`
	// Reader is the bare replication reader (no Kafka) at the same rates,
	// each in the window just before outboxd's; Fraction is outboxd's best
	// rate over the reader's best among them.
	Reader   *sustainedResult `json:"reader,omitempty"`
	Fraction float64          `json:"fraction_of_reader,omitempty"`
}

// keptUp: every row arrived, p99 under 100 ms, and the writers achieved
// the rate (else PostgreSQL, not the publisher, was the limit).
func keptUp(c latencyResult) bool {
	return c.Err == "" && c.Missing == 0 && c.P99Ms < 100 && c.AchievedRate >= 0.95*float64(c.Load.Rate)
}

func (r *runner) sustained(ctx context.Context, txRows, start int) sustainedResult {
	return r.sustainedOf(ctx, txRows, start, func(l load) latencyResult { return r.latencyCell(ctx, cdcSource(), l) })
}

// sustainedPaired is outboxd's search with the bare reader measured at the
// same rate in the window just before each of outboxd's, so the two are
// compared under the same machine load: the reader's best is the highest
// of those rates it kept up with, and Fraction outboxd's best over it.
func (r *runner) sustainedPaired(ctx context.Context, txRows, start int) sustainedResult {
	rd := &sustainedResult{TxRows: txRows}
	res := r.sustainedOf(ctx, txRows, start, func(l load) latencyResult {
		rc := r.readerCell(ctx, l)
		rd.Steps = append(rd.Steps, rc)
		return r.latencyCell(ctx, cdcSource(), l)
	})
	for i := range rd.Steps {
		c := &rd.Steps[i]
		if keptUp(*c) && (rd.Best == nil || c.Load.Rate > rd.Best.Load.Rate) {
			rd.Best = c
		}
		if !keptUp(*c) && (rd.Failed == nil || c.Load.Rate < rd.Failed.Load.Rate) {
			rd.Failed = c
		}
	}
	if rd.Failed != nil {
		rd.Bottleneck = bottleneck(*rd.Failed)
	}
	res.Reader = rd
	if rd.Best != nil && res.Best != nil {
		res.Fraction = float64(res.Best.Load.Rate) / float64(rd.Best.Load.Rate)
	}
	return res
}

// sustainedOf is the search with cell measuring one window.
func (r *runner) sustainedOf(ctx context.Context, txRows, start int, cell func(load) latencyResult) sustainedResult {
	res := sustainedResult{TxRows: txRows}
	step := func(rate int) latencyResult {
		c := cell(load{Rate: rate, TxRows: txRows})
		res.Steps = append(res.Steps, c)
		return c
	}
	lo, hi := 0, 0
	for rate := start; ctx.Err() == nil && rate <= 1<<20; rate *= 2 {
		c := step(rate)
		if !keptUp(c) {
			hi, res.Failed = rate, &res.Steps[len(res.Steps)-1]
			break
		}
		lo, res.Best = rate, &res.Steps[len(res.Steps)-1]
	}
	// The start was already too fast: halve (at most three times) until a
	// rate keeps up.
	for rate := hi / 2; lo == 0 && ctx.Err() == nil && rate >= txRows && len(res.Steps) < 4; rate /= 2 {
		rate = rate / txRows * txRows
		if c := step(rate); keptUp(c) {
			lo, res.Best = rate, &res.Steps[len(res.Steps)-1]
		} else {
			hi, res.Failed = rate, &res.Steps[len(res.Steps)-1]
		}
	}
	for range 2 {
		if lo == 0 || hi == 0 || ctx.Err() != nil {
			break
		}
		mid := (lo + hi) / 2 / txRows * txRows
		if mid <= lo {
			break
		}
		if c := step(mid); keptUp(c) {
			lo, res.Best = mid, &res.Steps[len(res.Steps)-1]
		} else {
			hi, res.Failed = mid, &res.Steps[len(res.Steps)-1]
		}
	}
	if f := res.Failed; f != nil {
		res.Bottleneck = bottleneck(*f)
	}
	return res
}

// bottleneck reads a failed window: writers short of the rate mean
// PostgreSQL's commits were the limit; otherwise the busiest process.
func bottleneck(c latencyResult) string {
	shares := fmt.Sprintf("CPU cores over the window: %s", formatShares(c.CPUShares))
	if c.Err != "" {
		return "failed: " + c.Err
	}
	if c.AchievedRate < 0.95*float64(c.Load.Rate) {
		return fmt.Sprintf("the writers reached only %.0f of %d ev/s: PostgreSQL's commits (fsync on) were the limit, not the publisher; %s", c.AchievedRate, c.Load.Rate, shares)
	}
	top, topV := "", 0.0
	for k, v := range c.CPUShares {
		if v > topV && k != "idle" {
			top, topV = k, v
		}
	}
	where := ""
	if side := c.Stages.side(); side != "" {
		where = fmt.Sprintf("; the time is spent %s: %s", side, c.Stages)
	}
	return fmt.Sprintf("p99 %.0f ms at %.0f ev/s%s; busiest: %s (%.2f cores); %s", c.P99Ms, c.AchievedRate, where, top, topV, shares)
}

func formatShares(m map[string]float64) string {
	var parts []string
	for _, k := range []string{"outboxd", "debezium", "reader", "walsender", "postgres (all)", "kafka broker", "proxy", "bench (writers, consumer)", "idle"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// cpuSample is the CPU time of the machine's parts at one moment.
type cpuSample struct {
	at                   time.Time
	kafka, self          time.Duration
	postgres             map[int]time.Duration // per process: see pgDelta
	idle                 time.Duration
	publisher, walsender time.Duration
	proxy                time.Duration
}

// kafkaMatch, when set (OUTBOXD_BENCH_KAFKA_DIR), picks the broker JVM whose
// command line contains it, so other brokers on a shared machine are not
// counted as the bench's; postmaster, when set, counts only that server's
// processes as PostgreSQL (other clusters on the machine are not ours).
var (
	kafkaMatch = os.Getenv("OUTBOXD_BENCH_KAFKA_DIR")
	postmaster int
)

// findPostmaster sets postmaster from a backend of the stack's server.
func findPostmaster(ctx context.Context, st stack) {
	conn, err := pgx.Connect(ctx, st.AdminDSN)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	var pid int
	if conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid) == nil {
		postmaster = parentPID(pid)
	}
}

func parentPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// sampleCPU reads /proc: every postgres process, the Kafka broker's JVM,
// this process, the machine's idle time, the publisher and its walsenders.
func sampleCPU(publisherPID int, walsenders []int) cpuSample {
	s := cpuSample{at: time.Now(), postgres: map[int]time.Duration{}}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range procs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(d + "/comm")
		if err != nil {
			continue
		}
		switch strings.TrimSpace(string(comm)) {
		case "postgres":
			if postmaster != 0 && pid != postmaster && parentPID(pid) != postmaster {
				continue
			}
			if c, err := testproc.CPUTime(pid); err == nil {
				s.postgres[pid] = c
			}
		case "netproxy":
			if c, err := testproc.CPUTime(pid); err == nil {
				s.proxy += c
			}
		case "java":
			if cmd, err := os.ReadFile(d + "/cmdline"); err == nil && strings.Contains(string(cmd), "kafka.Kafka") && strings.Contains(string(cmd), kafkaMatch) {
				if c, err := testproc.CPUTime(pid); err == nil {
					s.kafka += c
				}
			}
		}
	}
	if c, err := testproc.CPUTime(os.Getpid()); err == nil {
		s.self = c
	}
	if c, err := testproc.CPUTime(publisherPID); err == nil {
		s.publisher = c
	}
	s.walsender = backendsCPU(walsenders)
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		if f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]); len(f) > 4 {
			if v, err := strconv.ParseInt(f[4], 10, 64); err == nil {
				s.idle = time.Duration(v) * 10 * time.Millisecond // USER_HZ = 100
			}
		}
	}
	return s
}

// shares is how many cores each part used between two samples.
func shares(a, b cpuSample, publisher string) map[string]float64 {
	sec := b.at.Sub(a.at).Seconds()
	if sec <= 0 {
		return nil
	}
	// A process that exits between the samples takes its CPU time with it:
	// a part can come out below zero; it counts as 0.
	cores := func(d time.Duration) float64 { return max(0, float64(d)/float64(time.Second)/sec) }
	m := map[string]float64{
		publisher:                   cores(b.publisher - a.publisher),
		"walsender":                 cores(b.walsender - a.walsender),
		"postgres (all)":            cores(pgDelta(a.postgres, b.postgres)),
		"kafka broker":              cores(b.kafka - a.kafka),
		"bench (writers, consumer)": cores(b.self - a.self),
		"idle":                      cores(b.idle - a.idle),
	}
	if b.proxy > 0 {
		m["proxy"] = cores(b.proxy - a.proxy)
	}
	return m
}

func (s sustainedResult) summary() string {
	best := "none kept up"
	if s.Best != nil {
		best = fmt.Sprintf("%d ev/s kept up (p99 %.1f ms)", s.Best.Load.Rate, s.Best.P99Ms)
	}
	if s.Failed == nil {
		return best
	}
	return fmt.Sprintf("%s; %d ev/s did not: %s", best, s.Failed.Load.Rate, s.Bottleneck)
}

// pgDelta is the CPU PostgreSQL's processes used between two samples,
// process by process: one that exited in between (a previous cell's
// walsender, say) is left out instead of taking its whole CPU time off the
// sum, and one that started in between counts in full.
func pgDelta(a, b map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, c := range b {
		d += c - a[pid]
	}
	return d
}
