package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outboxd/poll"
)

// source is one way of publishing: CDC, or the poller with its settings.
type source struct {
	Name     string        `json:"name"`
	Poll     bool          `json:"poll"`
	Interval time.Duration `json:"interval_ns,omitempty"`
	Batch    int           `json:"batch,omitempty"`
	Workers  int           `json:"workers,omitempty"`
	// Flags are further outboxd run flags (a tuning variant).
	Flags []string `json:"flags,omitempty"`
	// Debezium runs Debezium's PostgreSQL connector with the Outbox Event
	// Router on a Kafka Connect standalone worker instead of outboxd, with
	// poll.interval.ms PollMs (debezium.go).
	Debezium bool `json:"debezium,omitempty"`
	PollMs   int  `json:"poll_ms,omitempty"`
	// OnlyLoads, when set, limits the source to these loads (a slow or
	// interval-bound source need not fill every cell).
	OnlyLoads []load `json:"only_loads,omitempty"`
}

// at reports whether the source runs at load l.
func (s source) at(l load) bool {
	return len(s.OnlyLoads) == 0 || slices.Contains(s.OnlyLoads, l)
}

func cdcSource() source { return source{Name: "cdc"} }

// cdcExactlyOnce is CDC with Kafka transactions (what exactly-once costs).
func cdcExactlyOnce() source {
	return source{Name: "cdc-exactly-once", Flags: []string{"--delivery=exactly-once"}}
}

// cdcLinger is CDC with the producer waiting up to d to batch records.
func cdcLinger(d time.Duration) source {
	return source{Name: "cdc-linger-" + d.String(), Flags: []string{"--kafka-linger=" + d.String()}}
}

func pollSource(interval time.Duration, batch int) source {
	name := fmt.Sprintf("poll-%s", interval)
	if batch != poll.DefaultConfig().BatchSize {
		name += fmt.Sprintf("-b%d", batch)
	}
	return source{Name: name, Poll: true, Interval: interval, Batch: batch, Workers: 1}
}

// args are outboxd run's source flags.
func (s source) args() []string {
	if !s.Poll {
		return s.Flags
	}
	return append([]string{"--source=poll", "--poll-interval=" + s.Interval.String(),
		fmt.Sprintf("--poll-batch-size=%d", s.Batch), fmt.Sprintf("--poll-workers=%d", s.Workers)}, s.Flags...)
}

// load is a target rate in a transaction shape.
type load struct {
	Rate   int `json:"rate"`    // events/s
	TxRows int `json:"tx_rows"` // rows per transaction
}

func (l load) String() string { return fmt.Sprintf("%d ev/s × %d row/tx", l.Rate, l.TxRows) }

// writers is the writer connections for l: enough for the rate at ~2 ms per
// commit (fsync on), at least 4 so transactions overlap as in a real
// service (that is what makes late-committing lower ids happen).
func (l load) writers() int {
	tx := l.Rate / l.TxRows
	return min(16, max(4, tx*2/1000+1))
}

// plan is what one benchmark run measures.
type plan struct {
	Name     string        `json:"name"`
	Sources  []source      `json:"sources"`
	Loads    []load        `json:"loads"`
	Duration time.Duration `json:"duration_ns"`
	// Repeats is how many rounds measure every cell; each round runs the
	// sources of a load in a rotated order (A B C, B C A, ...), and the
	// report gives the median with the spread.
	Repeats int `json:"repeats"`
	// WarmMin and WarmMax bound the broker warm-up before the first cell
	// (floor.go).
	WarmMin      time.Duration `json:"warm_min_ns"`
	WarmMax      time.Duration `json:"warm_max_ns"`
	Partitions   int32         `json:"partitions"`
	Aggregates   int           `json:"aggregates"`
	PayloadBytes int           `json:"payload_bytes"`
	// Backlog drain: DrainRows preloaded in DrainTxRows-row transactions.
	DrainRows   int `json:"drain_rows"`
	DrainTxRows int `json:"drain_tx_rows"`
	// DrainSources are drained from the same kind of backlog, after the
	// ceiling (the replication reader with no Kafka).
	DrainSources []source `json:"drain_sources"`
	// Consumer throughput (package consumer with dedup): ConsumerMessages
	// preloaded per run, each of ConsumerCells in Repeats rotated rounds.
	ConsumerMessages int            `json:"consumer_messages"`
	ConsumerCells    []consumerCell `json:"consumer_cells"`
	// Sustained searches the highest rate outboxd keeps up with for each
	// transaction shape, in windows of SustainedWindow (sustained.go);
	// only with -only sustained.
	Sustained       []sustainedSpec `json:"sustained,omitempty"`
	SustainedWindow time.Duration   `json:"sustained_window_ns,omitempty"`
	// SustainedReader measures the bare replication reader (no Kafka) at
	// each rate of outboxd's search, in the window just before outboxd's
	// (reader.go).
	SustainedReader bool `json:"sustained_reader,omitempty"`
	// BareProducer runs a bare producer beside each CDC latency cell, at
	// the same rate and record size in the same window (the floor outboxd's
	// latency is measured against).
	BareProducer bool `json:"bare_producer"`
	// CeilingOnce runs the drain's no-Kafka reader once, not before and
	// after the CDC drains.
	CeilingOnce bool `json:"ceiling_once,omitempty"`
	// Network (make bench-network): every latency cell, the hot aggregate
	// search and the drains at each of RTTs through the proxy.
	RTTs []time.Duration `json:"rtts_ns,omitempty"`
	Hot  *hotSpec        `json:"hot,omitempty"`
	// DebeziumRounds, when set, caps Debezium's latency rounds (its
	// worker takes ~10 s to start per cell).
	DebeziumRounds int `json:"debezium_rounds,omitempty"`
}

// hotSpec is the hot aggregate search: every event on one key, TxRows-row
// transactions, rates from Start doubled until p99 ≥ 100 ms, then halved
// towards it; at most Steps windows of Window.
type hotSpec struct {
	TxRows int           `json:"tx_rows"`
	Start  int           `json:"start"`
	Steps  int           `json:"steps"`
	Window time.Duration `json:"window_ns"`
}

// sustainedSpec is one sustained-rate search: its transaction shape and the
// rate it starts from (doubled until a window fails).
type sustainedSpec struct {
	TxRows int `json:"tx_rows"`
	Start  int `json:"start"`
}

// consumerCell is one consumer configuration: partitions × batch size.
type consumerCell struct {
	Partitions int32 `json:"partitions"`
	Batch      int   `json:"batch"`
}

var (
	loadsFull = []load{{100, 1}, {100, 10}, {1000, 1}, {1000, 10}, {5000, 1}, {5000, 10}}
)

// fullPlan is the full latency and drain matrix: outboxd (at-least-once and
// exactly-once), Debezium (poll.interval.ms 10 and its default 500) and
// polling every 10 ms at every load, polling every 100 ms at 1,000 ev/s;
// three rotated rounds of each cell; the 1,000,000-row drain; the consumer.
func fullPlan() plan {
	b := poll.DefaultConfig().BatchSize
	at1000 := []load{{1000, 1}, {1000, 10}}
	poll100 := pollSource(100*time.Millisecond, b)
	poll100.OnlyLoads = at1000
	return plan{
		Name: "full",
		Sources: []source{cdcSource(), cdcExactlyOnce(), debeziumSource(10 * time.Millisecond), debeziumSource(500 * time.Millisecond),
			pollSource(10*time.Millisecond, b), poll100},
		Loads:        loadsFull,
		Duration:     8 * time.Second,
		Repeats:      3,
		WarmMin:      30 * time.Second,
		WarmMax:      3 * time.Minute,
		Partitions:   3,
		Aggregates:   1000,
		PayloadBytes: 200,
		DrainRows:    1000000,
		DrainTxRows:  100,
		DrainSources: []source{cdcSource(), cdcExactlyOnce(), debeziumSource(10 * time.Millisecond), pollSource(100*time.Millisecond, b),
			pollSource(10*time.Millisecond, b)},
		ConsumerMessages: 20000,
		ConsumerCells:    []consumerCell{{1, 1}, {6, 1}, {1, 100}, {6, 100}},
		BareProducer:     true,
	}
}

// networkPlan is make bench-network: at a round trip of 0, 1
// and 5 ms between every publisher and the broker, the latency cells
// 1,000 × 1, 1,000 × 10 and 5,000 × 10 for outboxd (at-least-once and
// exactly-once), Debezium (10 ms poll) and polling (10 ms), a bare producer
// beside outboxd's cells, the hot aggregate search, and the 1,000,000-row
// drain of the same four. About 14 minutes on a quiet 2-core machine (27 under load).
func networkPlan() plan {
	b := poll.DefaultConfig().BatchSize
	srcs := []source{cdcSource(), cdcExactlyOnce(), debeziumSource(10 * time.Millisecond), pollSource(10*time.Millisecond, b)}
	return plan{
		Name:           "network",
		Sources:        srcs,
		Loads:          []load{{1000, 1}, {1000, 10}, {5000, 10}},
		Duration:       5 * time.Second,
		Repeats:        2,
		WarmMin:        20 * time.Second,
		WarmMax:        90 * time.Second,
		Partitions:     3,
		Aggregates:     1000,
		PayloadBytes:   200,
		DrainRows:      1000000,
		DrainTxRows:    100,
		DrainSources:   srcs,
		BareProducer:   true,
		CeilingOnce:    true,
		RTTs:           []time.Duration{0, time.Millisecond, 5 * time.Millisecond},
		Hot:            &hotSpec{TxRows: 10, Start: 4000, Steps: 4, Window: 5 * time.Second},
		DebeziumRounds: 1,
	}
}

// networkQuickPlan is the network matrix shrunk to a smoke test (make
// test): two round trips, one load, a tiny drain and a two-step hot search.
func networkQuickPlan() plan {
	b := poll.DefaultConfig().BatchSize
	p := networkPlan()
	p.Name = "network-quick"
	p.Sources = []source{cdcSource(), pollSource(10*time.Millisecond, b)}
	p.DrainSources = p.Sources
	p.Loads = []load{{500, 10}}
	p.Duration = 2 * time.Second
	p.Repeats = 1
	p.WarmMin, p.WarmMax = 0, 2*time.Second
	p.DrainRows = 5000
	p.RTTs = []time.Duration{0, time.Millisecond}
	p.Hot = &hotSpec{TxRows: 10, Start: 500, Steps: 1, Window: time.Second}
	return p
}

// quickPlan is the smoke-test matrix: each kind of source once at one
// load, a small backlog, a small consumer run; every output.
func quickPlan() plan {
	b := poll.DefaultConfig().BatchSize
	p := fullPlan()
	p.Name = "quick"
	p.Sources = []source{cdcSource(), debeziumSource(10 * time.Millisecond), pollSource(100*time.Millisecond, b), pollSource(10*time.Millisecond, b)}
	p.Loads = []load{{1000, 10}}
	p.Duration = 3 * time.Second
	p.Repeats = 1
	p.WarmMin, p.WarmMax = 0, 10*time.Second
	p.DrainRows = 20000
	p.DrainSources = []source{cdcSource(), debeziumSource(10 * time.Millisecond), pollSource(100*time.Millisecond, b)}
	p.ConsumerMessages = 2000
	p.ConsumerCells = []consumerCell{{2, 1}, {2, 100}}
	return p
}

// parseSource reads a source name: cdc, cdc-linger-DURATION,
// poll-DURATION or poll-DURATION-bBATCH.
func parseSource(name string) (source, error) {
	switch {
	case name == "cdc":
		return cdcSource(), nil
	case name == "cdc-exactly-once":
		return cdcExactlyOnce(), nil
	case strings.HasPrefix(name, "cdc-linger-"):
		d, err := time.ParseDuration(strings.TrimPrefix(name, "cdc-linger-"))
		if err != nil {
			return source{}, fmt.Errorf("source %q: %w", name, err)
		}
		return cdcLinger(d), nil
	case strings.HasPrefix(name, "debezium-"):
		d, err := time.ParseDuration(strings.TrimPrefix(name, "debezium-"))
		if err != nil || d < time.Millisecond {
			return source{}, fmt.Errorf("source %q: want debezium-POLLINTERVAL, e.g. debezium-10ms", name)
		}
		return debeziumSource(d), nil
	case strings.HasPrefix(name, "poll-"):
		spec, batch := strings.TrimPrefix(name, "poll-"), poll.DefaultConfig().BatchSize
		if i := strings.Index(spec, "-b"); i >= 0 {
			if _, err := fmt.Sscan(spec[i+2:], &batch); err != nil {
				return source{}, fmt.Errorf("source %q: batch: %w", name, err)
			}
			spec = spec[:i]
		}
		d, err := time.ParseDuration(spec)
		if err != nil {
			return source{}, fmt.Errorf("source %q: %w", name, err)
		}
		return pollSource(d, batch), nil
	}
	return source{}, fmt.Errorf("source %q: use cdc, cdc-exactly-once, cdc-linger-DURATION, debezium-DURATION, poll-DURATION or poll-DURATION-bBATCH", name)
}
