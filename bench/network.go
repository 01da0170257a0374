package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/testenv"
)

// make bench-network: the latency cells, a hot aggregate and the
// drain at several round trips between the publishers and the broker. The
// broker advertises a proxy (internal/netproxy, dev/stack proxy-start) on
// the listener the publishers bootstrap from, so every request of
// outboxd, Debezium's worker and the bare producer crosses it; the bench's
// admin client and consumer use the broker's direct listener, so the
// end-to-end latency is commit → the record in Kafka (+ a loopback fetch).

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type bareResult struct {
	f   floor
	err error
}

// bareProducer sends rate records/s in bursts of l.TxRows (a transaction's
// records at once), each of payloadBytes, keyed over aggregates keys, for
// d, through the publishers' brokers to a topic of its own; it returns
// send → ack per record. Settings as outboxd's producer: idempotent,
// acks=all, one request in flight.
func bareProducer(ctx context.Context, st stack, partitions int32, l load, aggregates, payloadBytes int, d time.Duration) (floor, error) {
	topic, err := createTopic(st, "bare", partitions)
	if err != nil {
		return floor{}, err
	}
	defer deleteTopic(st, topic)
	c := producerConfig()
	if l.TxRows > 1 {
		// A transaction's records go out together, as outboxd hands them
		// over at the commit: a request once the burst is in (or 1 ms).
		c.Producer.Flush.Messages = l.TxRows
		c.Producer.Flush.Frequency = time.Millisecond
	}
	c.Producer.Partitioner = sarama.NewHashPartitioner
	p, err := sarama.NewAsyncProducer(st.pubBrokers(), c)
	if err != nil {
		return floor{}, err
	}
	val := sarama.ByteEncoder(bytes.Repeat([]byte("x"), payloadBytes))
	var (
		mu   sync.Mutex
		lat  []float64
		errs int
	)
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		succ, fail := p.Successes(), p.Errors()
		for succ != nil || fail != nil {
			select {
			case m, ok := <-succ:
				if !ok {
					succ = nil
					continue
				}
				t0 := m.Metadata.(time.Time)
				mu.Lock()
				lat = append(lat, float64(time.Since(t0).Microseconds())/1000)
				mu.Unlock()
			case _, ok := <-fail:
				if !ok {
					fail = nil
					continue
				}
				mu.Lock()
				errs++
				mu.Unlock()
			}
		}
	}()
	period := time.Duration(float64(time.Second) * float64(l.TxRows) / float64(l.Rate))
	start := time.Now()
	sent := 0
	for j := 0; ; j++ {
		due := start.Add(time.Duration(j) * period)
		if !due.Before(start.Add(d)) || ctx.Err() != nil {
			break
		}
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		now := time.Now()
		for range l.TxRows {
			key := 0
			if aggregates > 1 {
				key = sent % aggregates
			}
			p.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("agg-%d", key)), Value: val, Metadata: now}
			sent++
		}
	}
	p.AsyncClose()
	<-collected
	f := floorOf(lat)
	if errs > 0 || f.Records != sent {
		return f, fmt.Errorf("bare producer: %d of %d records acknowledged, %d errors", f.Records, sent, errs)
	}
	return f, nil
}

// hotResult is the hot aggregate search at one round trip: every event on
// one key (so one partition), the highest rate with p99 < 100 ms.
type hotResult struct {
	RTTMs  float64         `json:"rtt_ms"`
	TxRows int             `json:"tx_rows"`
	Best   *latencyResult  `json:"best,omitempty"`
	Failed *latencyResult  `json:"failed,omitempty"`
	Steps  []latencyResult `json:"steps"`
}

// hot searches the hot aggregate's rate: doubled from the start until a
// window fails, then the gap halved, at most spec.Steps windows.
func (r runner) hot(ctx context.Context, spec hotSpec) hotResult {
	res := hotResult{RTTMs: ms(r.rtt), TxRows: spec.TxRows}
	hr := r
	hr.plan.Aggregates = 1
	hr.plan.Duration = spec.Window
	hr.plan.BareProducer = false
	step := func(rate int) bool {
		c := hr.latencyCell(ctx, cdcSource(), load{Rate: rate, TxRows: spec.TxRows})
		c.Source = "cdc-hot"
		res.Steps = append(res.Steps, c)
		return keptUp(c)
	}
	lo, hi := 0, 0
	for rate := spec.Start; ctx.Err() == nil && len(res.Steps) < spec.Steps && hi == 0; {
		if step(rate) {
			lo = rate
			rate *= 2
		} else {
			hi = rate
		}
	}
	for ctx.Err() == nil && len(res.Steps) < spec.Steps && hi > 0 {
		mid := (lo + hi) / 2 / spec.TxRows * spec.TxRows
		if lo == 0 {
			mid = hi / 2 / spec.TxRows * spec.TxRows
		}
		if mid <= lo || mid < spec.TxRows {
			break
		}
		if step(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	for i := range res.Steps {
		c := &res.Steps[i]
		if c.Load.Rate == lo && keptUp(*c) {
			res.Best = c
		}
		if c.Load.Rate == hi && !keptUp(*c) {
			res.Failed = c
		}
	}
	return res
}

// networkReport is everything make bench-network measured.
type networkReport struct {
	runInfo
	// Floors is the produce round trip through the proxy at each RTT,
	// measured before that RTT's cells.
	Floors  []rttFloor      `json:"floors"`
	Latency []latencyResult `json:"latency"`
	Hot     []hotResult     `json:"hot"`
	Drains  []drainResult   `json:"drains"`
	// Takeover is start-up and standby takeover per round trip (takeover.go).
	Takeover []takeoverResult `json:"takeover"`
	Targets  []target         `json:"targets"`
}

type rttFloor struct {
	RTTMs float64 `json:"rtt_ms"`
	Floor floor   `json:"floor"`
}

// network runs the matrix at each RTT in turn: floor, latency cells in
// rotated rounds, the hot aggregate, the drains.
func (r runner) network(ctx context.Context) (*networkReport, error) {
	p := r.plan
	rep := &networkReport{runInfo: newRunInfo(ctx, p, r.stack)}
	findPostmaster(ctx, r.stack)
	r.logf("bench %s: RTTs %v, %d sources × %d loads × %s × %d rounds, hot aggregate, %d-row drains; publishers through %v; %s",
		p.Name, p.RTTs, len(p.Sources), len(p.Loads), p.Duration, max(1, p.Repeats), p.DrainRows, r.stack.pubBrokers(), rep.Machine.summary())
	if err := r.setRTT(0); err != nil {
		return nil, err
	}
	pubStack := r.stack
	pubStack.Brokers = r.stack.pubBrokers()
	var err error
	if rep.Warmup, _, err = warmBroker(ctx, pubStack, p.WarmMin, p.WarmMax, r.logf); err != nil {
		return nil, fmt.Errorf("broker warm-up: %w", err)
	}
	// The broker is fresh: one transaction creates __transaction_state, so
	// the first exactly-once cell does not pay for it.
	if err := warmTransactions(pubStack); err != nil {
		return nil, fmt.Errorf("transaction warm-up: %w", err)
	}
	for _, rtt := range p.RTTs {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err := r.setRTT(rtt); err != nil {
			return nil, err
		}
		r.rtt = rtt
		f, err := measureFloor(pubStack)
		if err != nil {
			return nil, fmt.Errorf("floor at RTT %s: %w", rtt, err)
		}
		rep.Floors = append(rep.Floors, rttFloor{RTTMs: ms(rtt), Floor: f})
		r.logf("RTT %s: produce floor through the proxy %s", rtt, f)
		for round := range max(1, p.Repeats) {
			for _, l := range p.Loads {
				for i := range p.Sources {
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
					s := p.Sources[(i+round)%len(p.Sources)]
					if s.Debezium && p.DebeziumRounds > 0 && round >= p.DebeziumRounds {
						continue
					}
					c := r.latencyCell(ctx, s, l)
					c.Round = round + 1
					rep.Latency = append(rep.Latency, c)
				}
			}
		}
		if p.Hot != nil {
			r.logf("RTT %s: hot aggregate (one key), %d-row transactions, from %d ev/s:", rtt, p.Hot.TxRows, p.Hot.Start)
			h := r.hot(ctx, *p.Hot)
			rep.Hot = append(rep.Hot, h)
			if h.Best != nil {
				r.logf("  → %d ev/s kept up (p99 %.1f ms)", h.Best.Load.Rate, h.Best.P99Ms)
			} else {
				r.logf("  → none kept up")
			}
		}
		r.logf("RTT %s: start-up and standby takeover:", rtt)
		rep.Takeover = append(rep.Takeover, r.takeovers(ctx)...)
		if p.DrainRows > 0 && len(p.DrainSources) > 0 {
			r.logf("RTT %s: backlog drain, %d rows:", rtt, p.DrainRows)
			for _, d := range r.drains(ctx) {
				d.RTTMs = ms(rtt)
				rep.Drains = append(rep.Drains, d)
			}
		}
	}
	if err := r.setRTT(0); err != nil {
		r.logf("proxy back to RTT 0: %v", err)
	}
	rep.Finished = time.Now().UTC()
	rep.Machine.LoadEnd = loadAvg()
	return rep, nil
}

// warmTransactions commits one transaction (creating the broker's
// transaction state topic).
func warmTransactions(st stack) error {
	topic, err := createTopic(st, "warmtxn", 1)
	if err != nil {
		return err
	}
	defer deleteTopic(st, topic)
	c := producerConfig()
	c.Producer.Transaction.ID = testenv.UniqueName("bench-warm")
	p, err := sarama.NewSyncProducer(st.Brokers, c)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.BeginTxn(); err != nil {
		return err
	}
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("warm")}); err != nil {
		return err
	}
	return p.CommitTxn()
}

// httpRTT switches every proxy behind api (dev/stack proxy-start's DIR/api).
func httpRTT(api string) func(time.Duration) error {
	return func(rtt time.Duration) error {
		resp, err := http.Post(strings.TrimRight(api, "/")+"/proxies/all?rtt="+url.QueryEscape(rtt.String()), "", nil)
		if err != nil {
			return fmt.Errorf("proxy API: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("proxy API: %s", resp.Status)
		}
		return nil
	}
}

// cells are the successful rounds of src at l and rtt.
func (n *networkReport) cells(src string, l load, rtt float64) []latencyResult {
	var out []latencyResult
	for _, c := range n.Latency {
		if c.Source == src && c.Load == l && c.RTTMs == rtt && c.Err == "" {
			out = append(out, c)
		}
	}
	return out
}

func statOf(cs []latencyResult, f func(latencyResult) float64) spread {
	var v []float64
	for _, c := range cs {
		v = append(v, f(c))
	}
	return spreadOf(v)
}

func (n *networkReport) drain(src string, rtt float64) *drainResult {
	for i := range n.Drains {
		if d := &n.Drains[i]; d.Source == src && d.RTTMs == rtt && d.Err == "" {
			return d
		}
	}
	return nil
}

func (n *networkReport) hotAt(rtt float64) *hotResult {
	for i := range n.Hot {
		if n.Hot[i].RTTMs == rtt {
			return &n.Hot[i]
		}
	}
	return nil
}

func rttName(v float64) string {
	if v == 0 {
		return "loopback"
	}
	return fmt.Sprintf("RTT %g ms", v)
}

// evaluate checks the network targets that this run measures.
func (n *networkReport) evaluate() {
	n.Targets = nil
	add := func(goal, measured string, met bool) { n.Targets = append(n.Targets, target{goal, measured, met}) }
	const one = 1.0
	if d1, d0 := n.drain("cdc", one), n.drain("cdc", 0); d1 != nil && d0 != nil {
		add("RTT 1 ms: outboxd drain ≥ 50% of its loopback drain", fmt.Sprintf("%.0f%% (%.0f of %.0f ev/s)", 100*d1.EventsPerSec/d0.EventsPerSec, d1.EventsPerSec, d0.EventsPerSec),
			d1.EventsPerSec >= 0.5*d0.EventsPerSec)
	}
	for _, s := range n.Plan.DrainSources {
		if !s.Debezium {
			continue
		}
		if d, dz := n.drain("cdc", one), n.drain(s.Name, one); d != nil && dz != nil {
			add(fmt.Sprintf("RTT 1 ms: outboxd drain ≥ 5× %s's", s.Name), fmt.Sprintf("%.1f× (%.0f vs %.0f ev/s; after start-up %.1f×)", d.EventsPerSec/dz.EventsPerSec, d.EventsPerSec, dz.EventsPerSec, d.SteadyPerSec/max(1, dz.SteadyPerSec)),
				d.EventsPerSec >= 5*dz.EventsPerSec)
		}
	}
	if cs := n.cells("cdc", load{1000, 10}, one); len(cs) > 0 {
		p50 := statOf(cs, func(c latencyResult) float64 { return c.P50Ms })
		add("RTT 1 ms: 1,000 × 10 p50 ≤ RTT + 1 ms", fmt.Sprintf("p50 %s ms", p50), p50.Median <= 2)
	}
	if h1, h0 := n.hotAt(one), n.hotAt(0); h1 != nil && h0 != nil && h1.Best != nil && h0.Best != nil {
		add("RTT 1 ms: hot aggregate rate ≥ 50% of loopback's", fmt.Sprintf("%.0f%% (%d of %d ev/s)", 100*float64(h1.Best.Load.Rate)/float64(h0.Best.Load.Rate), h1.Best.Load.Rate, h0.Best.Load.Rate),
			h1.Best.Load.Rate*2 >= h0.Best.Load.Rate)
	}
	for _, rtt := range n.Plan.RTTs {
		cs := n.cells("cdc", load{1000, 1}, ms(rtt))
		var bare []float64
		for _, c := range cs {
			if c.Bare != nil {
				bare = append(bare, c.Bare.P99Ms)
			}
		}
		if len(cs) > 0 && len(bare) > 0 {
			p99 := statOf(cs, func(c latencyResult) float64 { return c.P99Ms })
			b := spreadOf(bare)
			add(fmt.Sprintf("%s: 1,000 × 1 p99 ≤ 1.5 × the bare producer's p99 (same window)", rttName(ms(rtt))), fmt.Sprintf("%s vs %s ms (%.1f×)", p99, b, p99.Median/b.Median),
				p99.Median <= 1.5*b.Median)
		}
	}
	n.evaluateTakeover(add)
}

// errors are the cells that failed (hot steps that missed the rate are
// the search, not failures).
func (n *networkReport) errors() []error {
	var errs []error
	for _, c := range n.Latency {
		if c.Err != "" {
			errs = append(errs, fmt.Errorf("%s at %s, %s: %s", c.Source, c.Load, rttName(c.RTTMs), c.Err))
		}
	}
	for _, d := range n.Drains {
		if d.Err != "" {
			errs = append(errs, fmt.Errorf("drain %s, %s: %s", d.Source, rttName(d.RTTMs), d.Err))
		}
	}
	for _, t := range n.Takeover {
		if t.Err != "" {
			errs = append(errs, fmt.Errorf("takeover %s, %s: %s", t.Source, rttName(t.RTTMs), t.Err))
		}
	}
	for _, h := range n.Hot {
		for _, c := range h.Steps {
			if c.Err != "" && !strings.Contains(c.Err, "not received") {
				errs = append(errs, fmt.Errorf("hot aggregate at %s, %s: %s", c.Load, rttName(h.RTTMs), c.Err))
			}
		}
	}
	return errs
}

// write puts network.json, network.md and network.png into dir.
func (n *networkReport) write(dir string) error {
	n.evaluate()
	return writeFiles(dir, "network", "network.png", n, n.markdown, n.chartReport())
}

// chartReport recasts the run as a bench report whose sources are
// "source @ RTT", for bench's chart.
func (n *networkReport) chartReport() *report {
	r := &report{runInfo: n.runInfo}
	r.Plan.Sources, r.Plan.DrainSources = nil, nil
	tag := func(name string, rtt float64) string { return fmt.Sprintf("%s rtt %gms", name, rtt) }
	for _, s := range n.Plan.Sources {
		for _, rtt := range n.Plan.RTTs {
			t := s
			t.Name = tag(s.Name, ms(rtt))
			r.Plan.Sources = append(r.Plan.Sources, t)
		}
	}
	for _, c := range n.Latency {
		c.Source = tag(c.Source, c.RTTMs)
		r.Latency = append(r.Latency, c)
	}
	for _, d := range n.Drains {
		d.Source = tag(d.Source, d.RTTMs)
		r.Drains = append(r.Drains, d)
		r.Plan.DrainSources = append(r.Plan.DrainSources, source{Name: d.Source})
	}
	return r
}

func (n *networkReport) markdown() string {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# outboxd at a distance from its broker (make bench-network, %s run)\n\n", n.Plan.Name)
	p("Run %s, %s. Generated by `bench/` (`make bench-network`); one run on one machine shared with other work: compare within a round trip and read ratios from this run.\n\n",
		n.Started.Format("2006-01-02 15:04 MST"), n.Finished.Sub(n.Started).Round(time.Second))
	m := n.Machine
	p("- Machine: %d cores, %s, %.1f GiB RAM, Linux %s, %s; load average %.2f at start, %.2f at end\n", m.Cores, m.CPU, m.MemoryGiB, m.Kernel, m.Go, m.LoadStart, m.LoadEnd)
	p("- PostgreSQL: %s (%s)\n", m.Postgres, m.PGSettings)
	p("- %s; the publishers (outboxd, Debezium's worker, the bare producer) reach it through internal/netproxy, which delays every chunk RTT/2 each way; the bench's consumer and admin client use the broker's direct listener\n", m.Kafka)
	p("- Latency cells: %s per window, %d rounds (sources rotated), %d aggregates, ~%d-byte payloads; the hot aggregate: one key, %d-row transactions, windows of %s\n\n",
		n.Plan.Duration, max(1, n.Plan.Repeats), n.Plan.Aggregates, n.Plan.PayloadBytes, n.hotRows(), n.hotWindow())
	p("![latency and drain by round trip](network.png)\n\n")
	p("Produce round trip through the proxy (one record, acks=all), before each round trip's cells:\n\n| RTT | p50 ms | p99 ms | max ms |\n|---|--:|--:|--:|\n")
	for _, f := range n.Floors {
		p("| %s | %.2f | %.2f | %.2f |\n", rttName(f.RTTMs), f.Floor.P50Ms, f.Floor.P99Ms, f.Floor.MaxMs)
	}
	p("\n## Latency, commit → record in Kafka, p50 / p99 ms, median of the rounds (min–max in the full table)\n\n| load | RTT |")
	for _, s := range n.Plan.Sources {
		p(" %s |", s.Name)
	}
	p(" bare producer p50 / p99 (beside cdc) |\n|---|---|%s--:|\n", strings.Repeat("--:|", len(n.Plan.Sources)))
	for _, l := range n.Plan.Loads {
		for _, rtt := range n.Plan.RTTs {
			p("| %s | %s |", l, rttName(ms(rtt)))
			for _, s := range n.Plan.Sources {
				cs := n.cells(s.Name, l, ms(rtt))
				if len(cs) == 0 {
					p(" FAILED |")
					continue
				}
				p(" %.2f / %.2f |", statOf(cs, func(c latencyResult) float64 { return c.P50Ms }).Median, statOf(cs, func(c latencyResult) float64 { return c.P99Ms }).Median)
			}
			var b50, b99 []float64
			for _, c := range n.cells("cdc", l, ms(rtt)) {
				if c.Bare != nil {
					b50, b99 = append(b50, c.Bare.P50Ms), append(b99, c.Bare.P99Ms)
				}
			}
			if len(b50) > 0 {
				p(" %.2f / %.2f |\n", spreadOf(b50).Median, spreadOf(b99).Median)
			} else {
				p(" – |\n")
			}
		}
	}
	p("\n## Hot aggregate: every event on one key, the highest rate with p99 < 100 ms\n\n| RTT | kept up | p99 there | did not keep up | p99 there | steps (ev/s: p99 ms) |\n|---|--:|--:|--:|--:|---|\n")
	for _, h := range n.Hot {
		best, bp, failed, fp := "none", "", "–", ""
		if h.Best != nil {
			best, bp = fmt.Sprintf("%d ev/s", h.Best.Load.Rate), fmt.Sprintf("%.1f", h.Best.P99Ms)
		}
		if h.Failed != nil {
			failed, fp = fmt.Sprintf("%d ev/s", h.Failed.Load.Rate), fmt.Sprintf("%.1f", h.Failed.P99Ms)
		}
		var steps []string
		for _, c := range h.Steps {
			note := ""
			if c.AchievedRate < 0.95*float64(c.Load.Rate) {
				note = fmt.Sprintf(", writers %.0f", c.AchievedRate)
			}
			if c.Err != "" {
				note += ", incomplete"
			}
			steps = append(steps, fmt.Sprintf("%d: %.1f%s", c.Load.Rate, c.P99Ms, note))
		}
		p("| %s | %s | %s | %s | %s | %s |\n", rttName(h.RTTMs), best, bp, failed, fp, strings.Join(steps, "; "))
	}
	n.takeoverMarkdown(p)
	p("\n## Backlog drain: %d rows in %d-row transactions\n\nThe ceiling is the replication reader alone (no Kafka) on the same backlog just before; %% of it is the drain's rate over the ceiling's at that round trip. In flight: outboxd's in-flight events gauge, median of 100 ms samples.\n\n| RTT | source | events/s | %% of ceiling | after start-up | start-up s | CPU ms/1k ev | peak RSS MiB | cores: publisher / walsender (or poll backends) / broker / proxy / idle | in flight p50 | load avg |\n|---|---|--:|--:|--:|--:|--:|--:|---|--:|--:|\n",
		n.Plan.DrainRows, n.Plan.DrainTxRows)
	for _, d := range n.Drains {
		if d.Err != "" {
			p("| %s | %s | FAILED: %s ||||||||\n", rttName(d.RTTMs), d.Source, mdEscape(d.Err))
			continue
		}
		sh := d.CPUShares
		pub := sh["outboxd"] + sh["debezium"]
		cores := "–"
		if sh != nil {
			cores = fmt.Sprintf("%.2f / %.2f / %.2f / %.2f / %.2f", pub, sh["walsender"], sh["kafka broker"], sh["proxy"], sh["idle"])
		}
		pct, steady, inflight := "–", "–", "–"
		if d.PctCeiling > 0 {
			pct = fmt.Sprintf("%.0f%%", d.PctCeiling)
		}
		if d.SteadyPerSec > 0 {
			steady = fmt.Sprintf("%.0f", d.SteadyPerSec)
		}
		if d.InFlight != nil {
			inflight = fmt.Sprintf("%.0f", d.InFlight.EventsP50)
		}
		p("| %s | %s | %.0f | %s | %s | %.2f | %.2f | %.0f | %s | %s | %.1f |\n", rttName(d.RTTMs), d.Source, d.EventsPerSec, pct, steady, d.StartupSeconds, d.CPUMsPer1k, d.PeakRSSMiB, cores, inflight, d.LoadAfter)
	}
	p("\n## Targets this run measures\n\n| target | measured | met |\n|---|---|---|\n")
	for _, t := range n.Targets {
		met := "**no**"
		if t.Met {
			met = "yes"
		}
		p("| %s | %s | %s |\n", t.Goal, t.Measured, met)
	}
	p("\n## Every latency round\n\n| RTT | load | source | round | achieved ev/s | p50 | p95 | p99 | max ms | bare p50 / p99 | start-up s | CPU ms/1k | cores: publisher / walsender / broker / proxy / bench / idle | stages | late key | missing / dup | load avg |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|--:|--:|--:|\n")
	all := slices.Clone(n.Latency)
	for _, h := range n.Hot {
		all = append(all, h.Steps...)
	}
	for _, c := range all {
		if c.Err != "" && c.Received == 0 {
			p("| %s | %s | %s | %d | FAILED: %s ||||||||||||\n", rttName(c.RTTMs), c.Load, c.Source, c.Round, mdEscape(c.Err))
			continue
		}
		bare := "–"
		if c.Bare != nil {
			bare = fmt.Sprintf("%.2f / %.2f", c.Bare.P50Ms, c.Bare.P99Ms)
		}
		sh := c.CPUShares
		stages := ""
		if c.Stages != nil {
			stages = mdEscape(c.Stages.String())
		}
		p("| %s | %s | %s | %d | %.0f | %.2f | %.2f | %.2f | %.2f | %s | %.2f | %.1f | %.2f / %.2f / %.2f / %.2f / %.2f / %.2f | %s | %d | %d / %d | %.2f |\n",
			rttName(c.RTTMs), c.Load, c.Source, c.Round, c.AchievedRate, c.P50Ms, c.P95Ms, c.P99Ms, c.MaxMs, bare, c.StartupSeconds, c.CPUMsPer1k,
			sh["outboxd"]+sh["debezium"], sh["walsender"], sh["kafka broker"], sh["proxy"], sh["bench (writers, consumer)"], sh["idle"], stages, c.LateKey, c.Missing, c.Duplicates, c.LoadAfter)
	}
	return b.String()
}

func (n *networkReport) hotRows() int {
	if n.Plan.Hot == nil {
		return 0
	}
	return n.Plan.Hot.TxRows
}

func (n *networkReport) hotWindow() time.Duration {
	if n.Plan.Hot == nil {
		return 0
	}
	return n.Plan.Hot.Window
}
