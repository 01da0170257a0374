package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Where outboxd's time goes: its own histograms split commit → Kafka where
// outboxd reads the transaction off the replication connection: commit →
// received (PostgreSQL's walsender decoding and sending, the network) and
// commit → acknowledged (plus outboxd's pipeline, producer and the broker). The bench reads both
// before and after a measured window; the difference of the buckets is the
// window's. Under CDC only (poll and Debezium have no such histograms).

const (
	histReceive = "outboxd_commit_to_receive_seconds"
	histAck     = "outboxd_commit_to_ack_seconds"
)

// stageLatency is one window's split, from histogram buckets twice as wide
// as the one below (0.5 ms, 1 ms, 2 ms, …), interpolated inside a bucket:
// good for telling the stages apart, not for a precise figure.
type stageLatency struct {
	Events       uint64  `json:"events"`
	ReceiveP50Ms float64 `json:"receive_p50_ms"`
	ReceiveP99Ms float64 `json:"receive_p99_ms"`
	AckP50Ms     float64 `json:"ack_p50_ms"`
	AckP99Ms     float64 `json:"ack_p99_ms"`
}

func (s *stageLatency) String() string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("commit → read off the connection p50 %.1f / p99 %.1f ms, → Kafka ack p50 %.1f / p99 %.1f ms (outboxd's histograms)",
		s.ReceiveP50Ms, s.ReceiveP99Ms, s.AckP50Ms, s.AckP99Ms)
}

// side says on which side of outboxd's reader the p99 is spent.
func (s *stageLatency) side() string {
	if s == nil || s.AckP99Ms <= 0 {
		return ""
	}
	if s.ReceiveP99Ms >= 0.5*s.AckP99Ms {
		return "before outboxd reads the transaction: PostgreSQL's walsender (decoding, sending)"
	}
	return "after outboxd read the transaction: its pipeline and producer, and the broker"
}

// bucket is one cumulative histogram bucket: count of observations ≤ le.
type bucket struct {
	le    float64
	count float64
}

// histograms are the buckets of every histogram in a scrape, by name.
type histograms map[string][]bucket

// get GETs url from outboxd's HTTP server within timeout and hands the
// response to read.
func get(ctx context.Context, url string, timeout time.Duration, read func(*http.Response) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return read(resp)
}

// scrapeHistograms reads the _bucket series of a Prometheus text exposition.
func scrapeHistograms(ctx context.Context, addr string) (h histograms, err error) {
	err = get(ctx, "http://"+addr+"/metrics", 5*time.Second, func(resp *http.Response) error {
		h, err = parseHistograms(resp.Body)
		return err
	})
	return h, err
}

func parseHistograms(r io.Reader) (histograms, error) {
	h := histograms{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "_bucket{")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.Index(rest, `le="`)
		if i < 0 {
			continue
		}
		leText, after, ok := strings.Cut(rest[i+4:], `"`)
		if !ok {
			continue
		}
		fields := strings.Fields(after[strings.Index(after, "}")+1:])
		if len(fields) == 0 {
			continue
		}
		le, err := strconv.ParseFloat(leText, 64) // "+Inf" parses as +Inf
		if err != nil {
			return nil, fmt.Errorf("bucket %q: %w", line, err)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bucket %q: %w", line, err)
		}
		h[name] = append(h[name], bucket{le: le, count: v})
	}
	for _, b := range h {
		sort.Slice(b, func(i, j int) bool { return b[i].le < b[j].le })
	}
	return h, sc.Err()
}

// since is h minus an earlier scrape of the same histogram.
func since(h, earlier []bucket) []bucket {
	out := make([]bucket, len(h))
	for i, b := range h {
		out[i] = b
		if i < len(earlier) && earlier[i].le == b.le {
			out[i].count -= earlier[i].count
		}
	}
	return out
}

// histQuantile is the q-quantile of cumulative buckets, interpolated
// linearly inside its bucket, in seconds; NaN without observations.
func histQuantile(q float64, bs []bucket) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	lo, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lo // beyond the last bound: the bound is all we know
			}
			if b.count == below {
				return b.le
			}
			return lo + (b.le-lo)*(rank-below)/(b.count-below)
		}
		lo, below = b.le, b.count
	}
	return lo
}

// stagesBetween is the window between two scrapes; nil when outboxd exports
// neither histogram (the poll source) or nothing was observed.
func stagesBetween(before, after histograms) *stageLatency {
	rcv, ack := since(after[histReceive], before[histReceive]), since(after[histAck], before[histAck])
	// Both must have seen the window's events: the poll source observes
	// commit → ack only.
	if len(ack) == 0 || len(rcv) == 0 || ack[len(ack)-1].count <= 0 || rcv[len(rcv)-1].count <= 0 {
		return nil
	}
	ms := func(v float64) float64 { return math.Round(v*1e5) / 100 }
	return &stageLatency{
		Events:       uint64(ack[len(ack)-1].count),
		ReceiveP50Ms: ms(histQuantile(0.5, rcv)), ReceiveP99Ms: ms(histQuantile(0.99, rcv)),
		AckP50Ms: ms(histQuantile(0.5, ack)), AckP99Ms: ms(histQuantile(0.99, ack)),
	}
}

// cpuProfile fetches a CPU profile of seconds from outboxd's /debug/pprof
// (-pprof) into path.
func cpuProfile(ctx context.Context, addr string, seconds int, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds)
	return get(ctx, url, time.Duration(seconds+30)*time.Second, func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("profile: %s", resp.Status)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}

// scrapeGauges reads the named gauges (no labels) from outboxd's metrics.
func scrapeGauges(ctx context.Context, addr string, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := get(ctx, "http://"+addr+"/metrics", 2*time.Second, func(resp *http.Response) error {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 {
				continue
			}
			for _, n := range names {
				if f[0] == n {
					if v, err := strconv.ParseFloat(f[1], 64); err == nil {
						out[n] = v
					}
				}
			}
		}
		return sc.Err()
	})
	return out, err
}
