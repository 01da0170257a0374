package cluster

// Broker faults on a replicated Kafka: one private 3-node cluster, topics of
// 6 partitions with replication factor 3 and min.insync.replicas=2, the real
// outboxd binary publishing a steady ~300 events/s (or draining a backlog)
// while brokers are killed, restarted, stopped two at a time or frozen.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// TestClusterFaults runs each fault as a subtest on its own topic, database
// and outboxd, on one cluster started once. Each asserts: nothing lost, no
// first delivery out of commit order per key, nothing corrupt, outboxd never
// exited (and stops cleanly at the end), Kafka's end offsets ≥ rows; and
// logs duplicates, restarts by cause and the longest stall. The subtests run
// one after another (three brokers are plenty for a small machine), the test
// itself beside the package's others: run alone, it held every parallel
// test of the package back for as long as it took, most of it waiting on
// paused brokers with the CPU idle.
func TestClusterFaults(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	c := testenv.StartKafkaCluster(t, 3)
	probeTopic := c.CreateTopic(t, "probe", 1)
	t.Logf("3-node cluster up in %s", time.Since(begin).Round(time.Millisecond))

	t.Run("KillMostLeaderThenPreferredElection", func(t *testing.T) {
		p := newClusterPhase(t, c, probeTopic)
		p.underLoad(func() {
			i := c.MostLeader(p.e.Topic)
			p.kill(i)
			// Start returns once the node registered again, which the
			// controller allows only after fencing it (and moving its
			// leaderships): the first leader change happens under load.
			p.start(i)
			c.WaitInSync(p.e.Topic)
			c.ElectPreferredLeaders(p.e.Topic) // the second leader change
			p.note("killed node %d (most leader), restarted, in sync, preferred leaders back", i)
		})
	})

	t.Run("RollingRestart", func(t *testing.T) {
		p := newClusterPhase(t, c, probeTopic)
		p.underLoad(func() {
			for i := range c.Len() {
				p.stop(i)
				p.start(i)
				c.WaitInSync(p.e.Topic)
				p.alive()
			}
			p.note("SIGTERM and restart of nodes 0, 1, 2, each back in every ISR before the next")
		})
	})

	t.Run("TwoBrokersDown20s", func(t *testing.T) {
		p := newClusterPhase(t, c, probeTopic)
		p.underLoad(func() {
			a := c.MostLeader(p.e.Topic)
			b := (a + 1) % c.Len()
			p.stop(a)
			p.stop(b)
			// The survivor leads with an ISR below min.insync.replicas:
			// every produce fails with NOT_ENOUGH_REPLICAS.
			p.hold(20 * time.Second)
			p.start(a)
			p.start(b)
			c.WaitInSync(p.e.Topic)
			p.note("stopped nodes %d and %d for 20 s", a, b)
		})
	})

	t.Run("MostLeaderPaused30s", func(t *testing.T) {
		p := newClusterPhase(t, c, probeTopic)
		p.underLoad(func() {
			i := c.MostLeader(p.e.Topic)
			p.pause(i)
			p.hold(30 * time.Second)
			p.resume(i)
			c.WaitInSync(p.e.Topic)
			p.note("SIGSTOPped node %d (most leader) for 30 s", i)
		})
	})

	t.Run("KillMostLeaderMidBacklogDrain", func(t *testing.T) {
		p := newClusterPhase(t, c, probeTopic)
		began := time.Now()
		// The slot must exist before the backlog is written, or it starts after it.
		p.e.Start().Stop()
		const rows = 100_000
		p.e.Backlog(rows)
		p.d, p.metrics = p.e.StartWithMetrics()
		p.waitOffsets(1, time.Minute)
		w := watchStalls(t, p.e.Brokers, p.e.Topic, p.metrics)
		defer w.end()
		p.waitOffsets(20_000, 3*time.Minute)
		at := e2e.EndOffsets(p.e.Brokers, p.e.Topic)
		i := c.MostLeader(p.e.Topic)
		p.note("restarts before the fault %v", p.d.Restarts())
		p.kill(i)
		p.start(i)
		c.WaitInSync(p.e.Topic)
		p.mark("fault over")
		p.note("killed node %d (most leader) with %d of %d rows published, restarted, in sync", i, at, rows)
		if at >= rows {
			t.Errorf("the backlog was drained before the kill: the fault was not mid-drain")
		}
		p.waitOffsets(rows, 3*time.Minute)
		p.mark("drained")
		p.verdict(w.end(), began)
	})
	t.Logf("cluster faults: %s in all", time.Since(begin).Round(time.Second))
}

// clusterPhase is one fault: its own database, topic and outboxd on the
// shared cluster, and the nodes it has taken out.
type clusterPhase struct {
	t          *testing.T
	c          *testenv.KafkaCluster
	e          *e2e.Env
	d          *e2e.Daemon
	metrics    string // outboxd's metrics base URL
	probeTopic string
	down       map[int]bool // stopped or killed by this phase
	paused     map[int]bool
	notes      []string
	timeline   []string
}

func newClusterPhase(t *testing.T, c *testenv.KafkaCluster, probeTopic string) *clusterPhase {
	t.Helper()
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: c.Brokers(), Topic: c.CreateTopic(t, "cluster", 6), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	p := &clusterPhase{t: t, c: c, e: e, probeTopic: probeTopic, down: map[int]bool{}, paused: map[int]bool{}}
	// A phase that failed half-way gives its nodes back, so the next phase
	// starts on a whole cluster.
	t.Cleanup(func() {
		for i := range p.paused {
			c.Node(i).Resume()
		}
		for i := range p.down {
			c.Node(i).Start()
		}
	})
	return p
}

func (p *clusterPhase) kill(i int) {
	p.mark("kill -9 node %d", i)
	p.c.Node(i).Kill()
	p.down[i] = true
	p.alive()
}

func (p *clusterPhase) stop(i int) {
	p.mark("stop node %d", i)
	p.c.Node(i).Stop()
	p.down[i] = true
	p.alive()
}

func (p *clusterPhase) start(i int) {
	p.mark("start node %d", i)
	p.c.Node(i).Start()
	delete(p.down, i)
	p.alive()
}

func (p *clusterPhase) pause(i int) {
	p.mark("pause node %d", i)
	p.c.Node(i).Pause()
	p.paused[i] = true
}

func (p *clusterPhase) resume(i int) {
	p.mark("resume node %d", i)
	p.c.Node(i).Resume()
	delete(p.paused, i)
	p.alive()
}

// mark notes a fault step with its time, to read beside outboxd's log.
func (p *clusterPhase) mark(format string, args ...any) {
	p.timeline = append(p.timeline, clock(time.Now())+" "+fmt.Sprintf(format, args...))
}

// note adds to the phase's summary.
func (p *clusterPhase) note(format string, args ...any) {
	p.notes = append(p.notes, fmt.Sprintf(format, args...))
}

// clock is t as outboxd's log shows it (UTC).
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// alive fails the test if outboxd has exited.
func (p *clusterPhase) alive() {
	p.t.Helper()
	if p.d != nil && p.d.Exited() {
		p.t.Fatalf("outboxd exited (%d) during the fault", p.d.Code)
	}
}

// hold keeps a fault on for d, watching that outboxd does not exit.
func (p *clusterPhase) hold(d time.Duration) {
	p.t.Helper()
	for since := time.Now(); time.Since(since) < d; {
		p.alive()
		time.Sleep(100 * time.Millisecond)
	}
	p.alive()
}

// waitOffsets waits until Kafka holds n records of the topic.
func (p *clusterPhase) waitOffsets(n int64, timeout time.Duration) {
	p.t.Helper()
	e2e.WaitFor(p.t, timeout, func() bool {
		p.alive()
		return e2e.EndOffsets(p.e.Brokers, p.e.Topic) >= n
	})
}

// underLoad starts outboxd and ~300 events/s, runs fault once it publishes,
// then, once Kafka accepts produce again, lets outboxd publish until it has
// caught up, stops the load and checks what arrived.
func (p *clusterPhase) underLoad(fault func()) {
	t := p.t
	t.Helper()
	began := time.Now()
	p.d, p.metrics = p.e.StartWithMetrics()
	p.d.WaitLog("streaming", 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := p.e.Steady(ctx, 300)
	p.waitOffsets(300, time.Minute)
	w := watchStalls(t, p.e.Brokers, p.e.Topic, p.metrics)
	defer w.end()
	p.note("restarts before the fault %v", p.d.Restarts())
	fault()
	p.mark("fault over")
	accepted, published := e2e.Recovery(t, p.e.Brokers, p.e.Topic, p.probeTopic, 2*time.Minute)
	p.note("Kafka accepts → outboxd publishes %s", published.Sub(accepted).Round(time.Millisecond))
	// Publishing a while more, under the load: until Kafka holds what was
	// written during the fault (a fixed 3 s did not say whether it did).
	p.waitOffsets(p.e.OutboxRows(), time.Minute)
	cancel()
	if err := <-writes; err != nil {
		t.Fatalf("load: %v", err)
	}
	p.verdict(w.end(), began)
}

// verdict reads the topic back and asserts the phase's invariants.
func (p *clusterPhase) verdict(st stallReport, began time.Time) {
	t := p.t
	t.Helper()
	p.alive()
	retries := 0.0
	for series, v := range e2e.Scrape(t, p.metrics) {
		if strings.HasPrefix(series, "outboxd_produce_retries_total") {
			retries += v
		}
	}
	p.settle()
	want := p.e.Rows()
	got := e2e.Consume(t, p.e.Brokers, p.e.Topic, want, 3*time.Minute)
	v, n := e2e.Verify(t, want, got), len(want)
	if v.Corrupt > 0 {
		p.explainCorrupt(want, got)
	}
	off := e2e.EndOffsets(p.e.Brokers, p.e.Topic)
	t.Logf("timeline: %s", strings.Join(p.timeline, "; "))
	t.Logf("%s: %d rows, %s; end offsets %d; longest stall: topic %s (from %s), one partition %s (p%d, from %s); "+
		"outboxd_stalled_seconds max %.1f; %d offset reads failed; produce retries %.0f; restarts in all %v; phase %s",
		strings.Join(p.notes, "; "), n, v, off, st.total.Round(time.Millisecond), clock(st.totalFrom),
		st.partition.Round(time.Millisecond), st.worst, clock(st.partFrom),
		st.metric, st.failed, retries, p.d.Restarts(), time.Since(began).Round(time.Second))
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Errorf("%s", v)
	}
	if off < int64(n) {
		t.Errorf("Kafka's end offsets %d < %d rows", off, n)
	}
	p.alive()
	p.d.Stop()
	if os.Getenv("OUTBOXD_CLUSTER_LOG") != "" {
		t.Logf("outboxd output:\n%s", p.d.Out.String())
	}
}

// settle: see env.settle.
func (p *clusterPhase) settle() { p.e.Settle() }

// explainCorrupt logs the records verify counted as corrupt for want
// of a known outbox-id, and whether their rows exist now (committed after
// the rows were read: a test artifact) or not (outboxd's).
func (p *clusterPhase) explainCorrupt(want map[int64]e2e.Row, got []*sarama.ConsumerMessage) {
	now := p.e.Rows()
	shown := 0
	for _, m := range got {
		id, err := strconv.ParseInt(e2e.Header(m, "outbox-id"), 10, 64)
		if _, ok := want[id]; ok && err == nil {
			continue
		}
		_, later := now[id]
		if shown++; shown <= 5 {
			p.t.Logf("corrupt: p%d offset %d key %q outbox-id %q (row exists now: %v) value %.80q",
				m.Partition, m.Offset, m.Key, e2e.Header(m, "outbox-id"), later && err == nil, m.Value)
		}
	}
}

// stallReport is what watchStalls saw while the load ran.
type stallReport struct {
	total     time.Duration // longest time no partition's end offset grew
	totalFrom time.Time     // when that began
	partition time.Duration // longest time one partition's did not
	worst     int32         // that partition
	partFrom  time.Time     // when that began
	metric    float64       // highest outboxd_stalled_seconds scraped
	failed    int           // end offset reads that failed
}

// stallWatch samples, every 100 ms, the end offset of each partition of a
// topic (each in its own goroutine on one shared client, so a frozen leader
// delays only the reads of its own partitions) and outboxd's
// outboxd_stalled_seconds.
type stallWatch struct {
	client sarama.Client
	start  time.Time
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu     sync.Mutex
	grew   map[int32][]time.Time // when each partition's end offset grew
	metric float64
	failed int
}

// watchStalls starts watching; the first sample (the baseline) is taken
// before it returns, so call it before the fault.
func watchStalls(t *testing.T, brokers []string, topic, metricsURL string) *stallWatch {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.Net.DialTimeout = time.Second
	cfg.Net.ReadTimeout = 2 * time.Second
	cfg.Net.WriteTimeout = 2 * time.Second
	cfg.Metadata.Retry.Max = 0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatalf("stall watch: %v", err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("stall watch: %v", err)
	}
	w := &stallWatch{client: client, start: time.Now(), stop: make(chan struct{}), grew: map[int32][]time.Time{}}
	base := make([]int64, len(parts))
	for i, p := range parts {
		if base[i], err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			t.Fatalf("stall watch: %v", err)
		}
		w.grew[p] = []time.Time{w.start}
	}
	for i, p := range parts {
		w.wg.Add(1)
		go w.partition(topic, p, base[i])
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for w.sleep() {
			if m := stalledSeconds(metricsURL); m >= 0 {
				w.mu.Lock()
				w.metric = max(w.metric, m)
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// sleep waits for the next sample; false once the watch is over.
func (w *stallWatch) sleep() bool {
	select {
	case <-w.stop:
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

func (w *stallWatch) partition(topic string, p int32, last int64) {
	defer w.wg.Done()
	for w.sleep() {
		off, err := w.client.GetOffset(topic, p, sarama.OffsetNewest)
		now := time.Now()
		w.mu.Lock()
		switch {
		case err != nil:
			w.failed++
		case off > last: // a new leader may briefly report a lower high watermark
			last = off
			w.grew[p] = append(w.grew[p], now)
		}
		w.mu.Unlock()
	}
}

// end stops the watch and returns its report.
func (w *stallWatch) end() stallReport {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
		_ = w.client.Close()
	})
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	r := stallReport{metric: w.metric, failed: w.failed}
	var all []time.Time
	for p, ts := range w.grew {
		ts = append(ts, now)
		all = append(all, ts...)
		for i := 1; i < len(ts); i++ {
			if d := ts[i].Sub(ts[i-1]); d > r.partition {
				r.partition, r.worst, r.partFrom = d, p, ts[i-1]
			}
		}
	}
	slices.SortFunc(all, time.Time.Compare)
	for i := 1; i < len(all); i++ {
		if d := all[i].Sub(all[i-1]); d > r.total {
			r.total, r.totalFrom = d, all[i-1]
		}
	}
	return r
}

// stalledSeconds scrapes outboxd_stalled_seconds, -1 if it cannot.
func stalledSeconds(base string) float64 {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "outboxd_stalled_seconds "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}
