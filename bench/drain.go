package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
	"github.com/outboxd/outboxd/slot"
)

// drainResult is one source draining a preloaded backlog.
type drainResult struct {
	Source       string  `json:"source"`
	Rows         int     `json:"rows"`
	Seconds      float64 `json:"seconds"` // process start → all rows in Kafka (ceiling: → all decoded)
	EventsPerSec float64 `json:"events_per_sec"`
	// StartupSeconds is process start → first row in Kafka; SteadyPerSec
	// the rate after it (rows / (Seconds − StartupSeconds)).
	StartupSeconds float64 `json:"startup_seconds"`
	SteadyPerSec   float64 `json:"steady_events_per_sec"`
	PctCeiling     float64 `json:"pct_of_ceiling"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	CPUMsPer1k     float64 `json:"cpu_ms_per_1k"`
	PeakRSSMiB     float64 `json:"peak_rss_mib"`
	PGCPUSeconds   float64 `json:"pg_cpu_seconds"`
	PG             pgCost  `json:"pg_statements"`
	LoadBefore     float64 `json:"load_before"`
	LoadAfter      float64 `json:"load_after"`
	ExitCode       int     `json:"exit_code"`
	Err            string  `json:"error,omitempty"`
	// CPUShares is how many cores each part of the machine used over the
	// drain; "walsender" is the publisher's server backends (the walsender
	// under CDC, the poll connections under polling): near 1 core, it is
	// the saturated process.
	CPUShares map[string]float64 `json:"cpu_shares,omitempty"`
	// RTTMs is the round trip the proxy added (bench-network), ms.
	RTTMs float64 `json:"rtt_ms"`
	// InFlight samples outboxd's outboxd_in_flight_events and _bytes every
	// 100 ms while it drains: how much the pipeline keeps between the
	// stream and Kafka's acks (CDC only).
	InFlight *inFlightSample `json:"in_flight,omitempty"`
	// Runs are the events/s of each ceiling run (the best one counts).
	Runs []float64 `json:"runs,omitempty"`
}

// ceilingName is the drain row of the replication reader with no Kafka.
const ceilingName = "ceiling (reader, no Kafka)"

// drains preloads the backlog once for the ceiling, CDC and the first poll
// source (two slots made before the preload hold it for the reader and for
// CDC; polling reads the table), and again for every further poll source.
func (r *runner) drains(ctx context.Context) []drainResult {
	p := r.plan
	var out []drainResult
	fail := func(name string, err error) {
		r.logf("  drain %s: %v", name, err)
		out = append(out, drainResult{Source: name, Rows: p.DrainRows, Err: err.Error(), ExitCode: -1})
	}
	db, err := createDatabase(ctx, r.stack, "drain")
	if err != nil {
		fail(ceilingName, err)
		return out
	}
	defer db.drop()
	topic, err := createTopic(r.stack, "drain", p.Partitions)
	if err != nil {
		fail(ceilingName, err)
		return out
	}
	defer deleteTopic(r.stack, topic)
	conn, err := db.connect(ctx)
	if err != nil {
		fail(ceilingName, err)
		return out
	}
	defer conn.Close(context.Background())
	kc, err := sarama.NewClient(r.stack.Brokers, kafkaConfig())
	if err != nil {
		fail(ceilingName, err)
		return out
	}
	defer kc.Close()

	// One slot per CDC source and two for the ceiling, all made before the
	// preload so each holds the whole backlog.
	pubName := testenv.UniqueName("drain")
	var cdc, polls []source
	slotOf := map[string]string{}
	for _, s := range p.DrainSources {
		if s.Poll {
			polls = append(polls, s)
		} else {
			cdc = append(cdc, s)
			slotOf[s.Name] = testenv.UniqueName("drain_cdc")
		}
	}
	ceilingSlots := []string{testenv.UniqueName("ceiling"), testenv.UniqueName("ceiling")}
	allSlots := append([]string(nil), ceilingSlots...)
	for _, sl := range slotOf {
		allSlots = append(allSlots, sl)
	}
	for _, sl := range allSlots {
		sc := slot.DefaultConfig()
		sc.Slot, sc.Publication = sl, pubName
		if _, err := slot.Ensure(ctx, conn, sc, true); err != nil {
			fail(ceilingName, err)
			return out
		}
	}
	dropSlots := func() {
		for _, sl := range allSlots {
			_ = execSQL(ctx, conn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", sl)
		}
	}
	defer dropSlots()
	loadBacklog := func() error {
		t0 := time.Now()
		if err := preload(ctx, db.DSN, topic, p.DrainRows, p.DrainTxRows, p.Aggregates, p.PayloadBytes); err != nil {
			return err
		}
		if err := execSQL(ctx, conn, "VACUUM ANALYZE outbox"); err != nil {
			return err
		}
		r.logf("  preloaded %d rows in %d-row transactions in %.1fs", p.DrainRows, p.DrainTxRows, time.Since(t0).Seconds())
		return nil
	}
	if err := loadBacklog(); err != nil {
		fail(ceilingName, err)
		return out
	}

	// The ceiling runs before and after the CDC drains (the first reader
	// of fresh WAL may pay for what later ones find done); the faster run
	// counts.
	ceiling := r.ceiling(ctx, db, ceilingSlots[0], pubName)
	var results []drainResult
	var inKafka int64 // records already in the topic
	next := func(s source, slotName string) {
		res := r.drainOne(ctx, db, kc, topic, slotName, pubName, s, inKafka+int64(p.DrainRows))
		results = append(results, res)
		if n, err := highWatermarks(kc, topic); err == nil {
			inKafka = n
		}
	}
	for _, s := range cdc {
		next(s, slotOf[s.Name])
	}
	if len(cdc) > 0 && !p.CeilingOnce {
		again := r.ceiling(ctx, db, ceilingSlots[1], pubName)
		ceiling.Runs = append(ceiling.Runs, again.Runs...)
		if again.Err == "" && (ceiling.Err != "" || again.EventsPerSec > ceiling.EventsPerSec) {
			again.Runs = ceiling.Runs
			ceiling = again
		}
	}
	dropSlots()
	for i, s := range polls {
		if i > 0 {
			if err := execSQL(ctx, conn, "TRUNCATE outbox"); err != nil {
				fail(s.Name, err)
				continue
			}
			if err := loadBacklog(); err != nil {
				fail(s.Name, err)
				continue
			}
		}
		next(s, "unused")
	}
	out = append(out, ceiling)
	for _, res := range results {
		if ceiling.EventsPerSec > 0 {
			res.PctCeiling = 100 * res.EventsPerSec / ceiling.EventsPerSec
		}
		out = append(out, res)
	}
	return out
}

// ceiling runs the ceiling child on the backlog.
func (r *runner) ceiling(ctx context.Context, db *database, slotName, pubName string) drainResult {
	res := drainResult{Source: ceilingName, Rows: r.plan.DrainRows, LoadBefore: loadAvg()}
	c, err := testproc.Launch(r.self, []string{"-dsn", db.DSN, "-slot", slotName, "-publication", pubName,
		"-want", fmt.Sprint(r.plan.DrainRows)}, childEnv+"=ceiling")
	if err != nil {
		res.Err = err.Error()
		return res
	}
	<-c.Done()
	res.LoadAfter = loadAvg()
	res.ExitCode = c.State().ExitCode()
	if ru, ok := c.State().SysUsage().(*syscall.Rusage); ok {
		res.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		res.PeakRSSMiB = float64(ru.Maxrss) / 1024 // KiB on Linux
	}
	var co ceilingOutput
	lines := strings.Split(strings.TrimSpace(c.Output()), "\n")
	if res.ExitCode != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &co) != nil {
		res.Err = fmt.Sprintf("ceiling child exited %d: %s", res.ExitCode, c.Tail(5))
		r.logf("  %s: %s", ceilingName, res.Err)
		return res
	}
	res.Seconds = co.Seconds
	res.EventsPerSec = float64(co.Events) / co.Seconds
	res.Runs = []float64{math.Round(res.EventsPerSec)}
	res.CPUMsPer1k = res.CPUSeconds * 1e6 / float64(co.Events)
	r.logf("  drain %-28s %8.0f ev/s  %6.2fs (start-up %.2fs)  cpu %5.2f ms/1k  rss %4.0f MiB  load %.2f",
		res.Source, res.EventsPerSec, res.Seconds, res.StartupSeconds, res.CPUMsPer1k, res.PeakRSSMiB, res.LoadAfter)
	return res
}

// drainOne starts the publisher on the backlog and waits until Kafka holds
// want records in the topic.
func (r *runner) drainOne(ctx context.Context, db *database, kc sarama.Client, topic, slotName, pubName string, s source, want int64) (res drainResult) {
	res = drainResult{Source: s.Name, Rows: r.plan.DrainRows, LoadBefore: loadAvg(), ExitCode: -1, RTTMs: ms(r.rtt)}
	conn, err := db.connect(ctx)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer conn.Close(context.Background())
	if err := resetStatements(ctx, conn); err != nil {
		res.Err = err.Error()
		return res
	}
	started := time.Now()
	pub, done, metricsAddr, err := r.launch(db, slotName, pubName, s)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer done()
	sampled := make(chan *inFlightSample, 1)
	stopSampling := make(chan struct{})
	if metricsAddr != "" {
		go func() { sampled <- sampleInFlight(ctx, metricsAddr, stopSampling) }()
		if r.pprofDir != "" {
			// A CPU profile from 1 s into the drain, for 5 s.
			path := filepath.Join(r.pprofDir, fmt.Sprintf("drain-%s-rtt%gms-%s.cpu.prof", s.Name, ms(r.rtt), time.Now().Format("150405")))
			go func() {
				select {
				case <-time.After(time.Second):
				case <-stopSampling:
					return
				}
				if err := cpuProfile(ctx, metricsAddr, 5, path); err != nil {
					r.logf("  profile of drain %s: %v", s.Name, err)
				}
			}()
		}
	} else {
		sampled <- nil
	}
	defer func() {
		close(stopSampling)
		res.InFlight = <-sampled
		if res.InFlight != nil {
			r.logf("  %-34s in flight: %s", "", res.InFlight)
		}
	}()
	mach0 := sampleCPU(pub.PID(), nil)
	var pids []int
	var pgCPU time.Duration
	base := want - int64(r.plan.DrainRows)
	deadline := time.Now().Add(15 * time.Minute)
	for {
		n, err := highWatermarks(kc, topic)
		if err == nil && n > base && res.StartupSeconds == 0 {
			res.StartupSeconds = time.Since(started).Seconds()
		}
		if err == nil && n >= want {
			break
		}
		if pub.Exited() || time.Now().After(deadline) {
			res.Err = fmt.Sprintf("%d of %d rows in Kafka when the publisher %s: %s", n-(want-int64(r.plan.DrainRows)), r.plan.DrainRows,
				map[bool]string{true: "exited", false: "timed out"}[pub.Exited()], pub.Tail(5))
			res.ExitCode = pub.Terminate(30 * time.Second)
			r.logf("  drain %s: %s", s.Name, res.Err)
			return res
		}
		if p, err := publisherBackends(ctx, conn, db.Database); err == nil && len(p) > 0 {
			pids = p
			pgCPU = backendsCPU(pids) // the backends live as long as the publisher
		}
		time.Sleep(20 * time.Millisecond)
	}
	publisherName := "outboxd"
	if s.Debezium {
		publisherName = "debezium"
	}
	res.CPUShares = shares(mach0, sampleCPU(pub.PID(), nil), publisherName)
	res.Seconds = time.Since(started).Seconds()
	res.EventsPerSec = float64(r.plan.DrainRows) / res.Seconds
	if steady := res.Seconds - res.StartupSeconds; steady > 0 {
		res.SteadyPerSec = float64(r.plan.DrainRows) / steady
	}
	if c, err := testproc.CPUTime(pub.PID()); err == nil {
		res.CPUSeconds = c.Seconds()
		res.CPUMsPer1k = res.CPUSeconds * 1e6 / float64(r.plan.DrainRows)
	}
	if rss, err := testproc.PeakRSS(pub.PID()); err == nil {
		res.PeakRSSMiB = float64(rss) / (1 << 20)
	}
	if c := backendsCPU(pids); c > pgCPU {
		pgCPU = c
	}
	res.PGCPUSeconds = pgCPU.Seconds()
	if res.CPUShares != nil {
		// The backends start after mach0: their whole CPU time is the drain's.
		res.CPUShares["walsender"] = res.PGCPUSeconds / res.Seconds
	}
	res.ExitCode = pub.Terminate(30 * time.Second)
	res.LoadAfter = loadAvg()
	if !cleanExit(s, res.ExitCode) {
		res.Err = fmt.Sprintf("publisher exited %d: %s", res.ExitCode, pub.Tail(5))
	}
	res.PG, _ = publisherStatements(ctx, conn)
	r.logf("  drain %-28s %8.0f ev/s  %6.2fs (start-up %.2fs)  cpu %5.2f ms/1k  rss %4.0f MiB  load %.2f",
		res.Source, res.EventsPerSec, res.Seconds, res.StartupSeconds, res.CPUMsPer1k, res.PeakRSSMiB, res.LoadAfter)
	r.logf("  %-34s cores: %s", "", formatShares(res.CPUShares))
	return res
}

// inFlightSample is the distribution of outboxd's in-flight gauges over a
// drain.
type inFlightSample struct {
	Samples      int     `json:"samples"`
	EventsP50    float64 `json:"events_p50"`
	EventsMax    float64 `json:"events_max"`
	BytesP50     float64 `json:"bytes_p50"`
	BytesMax     float64 `json:"bytes_max"`
	PublishedEnd float64 `json:"published_end"`
}

func (s *inFlightSample) String() string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("events p50 %.0f max %.0f, bytes p50 %.0f KiB max %.0f KiB (%d samples, outboxd's gauges)",
		s.EventsP50, s.EventsMax, s.BytesP50/1024, s.BytesMax/1024, s.Samples)
}

// sampleInFlight scrapes outboxd's in-flight gauges every 100 ms until stop.
func sampleInFlight(ctx context.Context, addr string, stop <-chan struct{}) *inFlightSample {
	var ev, by []float64
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			if len(ev) == 0 {
				return nil
			}
			e, b := floorOf(ev), floorOf(by)
			return &inFlightSample{Samples: len(ev), EventsP50: e.P50Ms, EventsMax: e.MaxMs, BytesP50: b.P50Ms, BytesMax: b.MaxMs}
		case <-t.C:
			g, err := scrapeGauges(ctx, addr, "outboxd_in_flight_events", "outboxd_in_flight_bytes")
			if err == nil && len(g) == 2 {
				ev, by = append(ev, g["outboxd_in_flight_events"]), append(by, g["outboxd_in_flight_bytes"])
			}
		}
	}
}
