package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// latencyResult is one source at one load.
type latencyResult struct {
	Source string `json:"source"`
	Load   load   `json:"load"`
	Round  int    `json:"round"`
	// The load as achieved.
	Writers      int     `json:"writers"`
	Written      int     `json:"written"`
	WriteSeconds float64 `json:"write_seconds"`
	AchievedRate float64 `json:"achieved_rate"`
	// Delivery.
	Received   int `json:"received"`
	Missing    int `json:"missing"`
	Duplicates int `json:"duplicates"`
	// End-to-end latency: consumer receipt − writer's commit return, ms.
	P50Ms    float64 `json:"p50_ms"`
	P95Ms    float64 `json:"p95_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	Negative int     `json:"negative"` // arrived before the commit returned (counted as 0)
	// PerSecondP50Ms is p50 and PerSecondMaxMs the max by second of commit
	// time: growth over the window means the source does not keep up.
	PerSecondP50Ms []float64 `json:"per_second_p50_ms"`
	PerSecondMaxMs []float64 `json:"per_second_max_ms"`
	// Order: rows that arrived after a higher id on the same partition, and
	// of the same key (each key has one sequential writer).
	LatePartition int `json:"late_partition"`
	LateKey       int `json:"late_key"`
	// CPUShares is how many cores each part of the machine used over the
	// measured window (outboxd or the publisher, its walsender or poll
	// connections, all of PostgreSQL, the Kafka broker, this program's
	// writers and consumer, idle).
	CPUShares map[string]float64 `json:"cpu_shares,omitempty"`
	// StartupSeconds is the publisher's start → its first record in Kafka.
	StartupSeconds float64 `json:"startup_seconds"`
	// The publisher process over the measured window.
	CPUSeconds float64 `json:"cpu_seconds"`
	CPUMsPer1k float64 `json:"cpu_ms_per_1k"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// PostgreSQL: the backends serving the publisher (walsender or poll
	// connections) and the poller's statements.
	PGCPUSeconds   float64 `json:"pg_cpu_seconds"`
	PGCPUMsPer1k   float64 `json:"pg_cpu_ms_per_1k"`
	PG             pgCost  `json:"pg_statements"`
	PGBlocksPer1k  float64 `json:"pg_blocks_per_1k"`
	PGWALBPerEvent float64 `json:"pg_wal_bytes_per_event"`
	TuplesRead     int64   `json:"tuples_read"`
	TuplesUpdated  int64   `json:"tuples_updated"`
	// Stages splits outboxd's own commit → Kafka time at its reader (CDC
	// only; stages.go).
	Stages *stageLatency `json:"stages,omitempty"`
	// Bare is a bare producer (sarama, idempotent, acks=all, one request
	// in flight: outboxd's settings) sending the same number of records of
	// the same size at the same rate, through the same brokers, in the same
	// window: send → ack per record (CDC cells, plan.BareProducer).
	Bare *floor `json:"bare_producer,omitempty"`
	// RTTMs is the round trip the proxy added (bench-network), ms.
	RTTMs float64 `json:"rtt_ms"`
	// Machine load (1-minute average) before and after.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
	ExitCode   int     `json:"exit_code"`
	Err        string  `json:"error,omitempty"`
}

type runner struct {
	stack stack
	bin   string // outboxd
	self  string // this program, for the ceiling child
	plan  plan
	logf  func(format string, args ...any)
	// debeziumLibs is the folder of Debezium's jars, once fetched.
	debeziumLibs string
	// pprofDir, when set, receives a CPU profile of outboxd from the middle
	// of each latency window (-pprof).
	pprofDir string
	// setRTT switches the proxy in front of the publishers' brokers
	// (bench-network); rtt is the round trip it adds now.
	setRTT func(time.Duration) error
	rtt    time.Duration
}

// latencyCell measures one source at one load in a database and topic of
// its own.
func (r *runner) latencyCell(ctx context.Context, s source, l load) (res latencyResult) {
	res = latencyResult{Source: s.Name, Load: l, Writers: l.writers(), LoadBefore: loadAvg(), ExitCode: -1, RTTMs: ms(r.rtt)}
	defer func() { res.LoadAfter = loadAvg() }()
	fail := func(err error) latencyResult {
		res.Err = err.Error()
		r.logf("  %s at %s: %v", s.Name, l, err)
		return res
	}
	db, topic, conn, cleanup, err := r.cellEnv(ctx, "bench")
	if err != nil {
		return fail(err)
	}
	defer cleanup()

	clk := clock{base: time.Now()}
	cons, err := startConsumer(r.stack, topic, clk)
	if err != nil {
		return fail(err)
	}
	consumed := false
	defer func() {
		if !consumed {
			cons.close()
		}
	}()
	name := testenv.UniqueName("bench")
	pub, done, metricsAddr, err := r.launch(db, name, name, s)
	if err != nil {
		return fail(err)
	}
	defer done()
	defer func() {
		if code := pub.Terminate(30 * time.Second); res.ExitCode == -1 {
			res.ExitCode = code
		}
	}()

	// Warm-up: once the publisher's server connections exist (under CDC
	// the slot is created first, and rows before it are not in it), rows
	// until the first arrives, then a second of traffic.
	started := time.Now()
	for deadline := started.Add(180 * time.Second); ; {
		// Under CDC (outboxd or Debezium) rows count from when the slot
		// streams: earlier ones are not in it.
		if s.Poll {
			if pids, err := publisherBackends(ctx, conn, db.Database); err == nil && len(pids) > 0 {
				break
			}
		} else if slotActive(ctx, conn, name) {
			break
		}
		if pub.Exited() || time.Now().After(deadline) {
			return fail(fmt.Errorf("publisher not connected within 180s: %s", pub.Tail(5)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for deadline := time.Now().Add(180 * time.Second); cons.count() == 0; {
		if pub.Exited() {
			return fail(fmt.Errorf("publisher exited during warm-up: %s", pub.Tail(5)))
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("no record within 180s of start: %s", pub.Tail(5)))
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('warm', $1, '{}')`, topic); err != nil {
			return fail(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.StartupSeconds = time.Since(started).Seconds()
	// From here on every row must arrive: count only rows written from
	// now (a row written while the stream was starting may not be in it:
	// Debezium's worker reports its slot active a moment before it
	// streams).
	var next int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(id), 0) + 1 FROM outbox`).Scan(&next); err != nil {
		return fail(err)
	}
	cons.countFrom(next)
	w, err := writeLoad(ctx, db.DSN, clk, topic, min(l.Rate, 500), 1, 2, r.plan.Aggregates, r.plan.PayloadBytes, time.Second)
	if err != nil {
		return fail(err)
	}
	warm := len(w)
	if !cons.waitForFrom(warm, 60*time.Second) {
		return fail(fmt.Errorf("warm-up: %d of %d records in 60s", cons.nFrom.Load(), warm))
	}

	// The measured window.
	if err := resetStatements(ctx, conn); err != nil {
		return fail(err)
	}
	read0, upd0, err := tableReads(ctx, conn)
	if err != nil {
		return fail(err)
	}
	pids, err := publisherBackends(ctx, conn, db.Database)
	if err != nil {
		return fail(err)
	}
	pg0 := backendsCPU(pids)
	cpu0, err := testproc.CPUTime(pub.PID())
	if err != nil {
		return fail(err)
	}
	mach0 := sampleCPU(pub.PID(), pids)
	var hist0 histograms
	if metricsAddr != "" {
		hist0, _ = scrapeHistograms(ctx, metricsAddr) // nil: no stages
	}
	profiled := make(chan struct{})
	if r.pprofDir != "" && metricsAddr != "" {
		// From a quarter into the window, for half of it (at most 10 s).
		secs := max(1, min(10, int(r.plan.Duration.Seconds()/2)))
		path := filepath.Join(r.pprofDir, fmt.Sprintf("%s-%dx%d-%s.cpu.prof", s.Name, l.Rate, l.TxRows, time.Now().Format("150405")))
		go func() {
			defer close(profiled)
			select {
			case <-time.After(r.plan.Duration / 4):
			case <-ctx.Done():
				return
			}
			if err := cpuProfile(ctx, metricsAddr, secs, path); err != nil {
				r.logf("  profile of %s at %s: %v", s.Name, l, err)
			}
		}()
	} else {
		close(profiled)
	}
	var bare chan bareResult
	if r.plan.BareProducer && !s.Poll && !s.Debezium {
		bare = make(chan bareResult, 1)
		go func() {
			f, err := bareProducer(ctx, r.stack, r.plan.Partitions, l, r.plan.Aggregates, r.plan.PayloadBytes, r.plan.Duration)
			bare <- bareResult{f, err}
		}()
	}
	began := time.Now()
	rows, err := writeLoad(ctx, db.DSN, clk, topic, l.Rate, l.TxRows, l.writers(), r.plan.Aggregates, r.plan.PayloadBytes, r.plan.Duration)
	if err != nil {
		return fail(err)
	}
	res.WriteSeconds = time.Since(began).Seconds()
	if bare != nil {
		if b := <-bare; b.err != nil {
			r.logf("  bare producer at %s: %v", l, b.err)
		} else {
			res.Bare = &b.f
		}
	}
	res.Written = len(rows)
	res.AchievedRate = float64(len(rows)) / res.WriteSeconds
	publisherName := "outboxd"
	if s.Debezium {
		publisherName = "debezium"
	}
	res.CPUShares = shares(mach0, sampleCPU(pub.PID(), pids), publisherName)
	complete := cons.waitForFrom(warm+len(rows), 60*time.Second)
	<-profiled
	if hist0 != nil {
		if hist1, err := scrapeHistograms(ctx, metricsAddr); err == nil {
			res.Stages = stagesBetween(hist0, hist1)
		}
	}
	cpu1, err := testproc.CPUTime(pub.PID())
	if err != nil {
		return fail(fmt.Errorf("publisher exited: %s", pub.Tail(5)))
	}
	pg1 := backendsCPU(pids)
	if rss, err := testproc.PeakRSS(pub.PID()); err == nil {
		res.PeakRSSMiB = float64(rss) / (1 << 20)
	}
	res.ExitCode = pub.Terminate(30 * time.Second)
	if !cleanExit(s, res.ExitCode) {
		res.Err = fmt.Sprintf("publisher exited %d: %s", res.ExitCode, pub.Tail(5))
	}
	waitNoBackends(ctx, conn, db.Database, 10*time.Second)
	if res.PG, err = publisherStatements(ctx, conn); err != nil {
		return fail(err)
	}
	read1, upd1, err := tableReads(ctx, conn)
	if err != nil {
		return fail(err)
	}
	res.TuplesRead, res.TuplesUpdated = read1-read0, upd1-upd0

	per1k := 1000 / float64(max(1, len(rows)))
	res.CPUSeconds = (cpu1 - cpu0).Seconds()
	res.CPUMsPer1k = res.CPUSeconds * 1000 * per1k
	res.PGCPUSeconds = (pg1 - pg0).Seconds()
	res.PGCPUMsPer1k = res.PGCPUSeconds * 1000 * per1k
	res.PGBlocksPer1k = float64(res.PG.Blocks) * per1k
	res.PGWALBPerEvent = float64(res.PG.WALBytes) / float64(max(1, len(rows)))

	consumed = true
	analyse(&res, rows, cons.close())
	res.LoadAfter = loadAvg()
	if !complete && res.Err == "" {
		res.Err = fmt.Sprintf("%d of %d rows not received within 60s", res.Missing, res.Written)
	}
	r.logf("  %-12s %-22s p50 %7.2f  p99 %7.2f  max %7.2f ms  %6.0f ev/s  cpu %5.1f ms/1k  rss %4.0f MiB  late %d/%d  load %.2f",
		s.Name, l, res.P50Ms, res.P99Ms, res.MaxMs, res.AchievedRate, res.CPUMsPer1k, res.PeakRSSMiB, res.LatePartition, res.LateKey, res.LoadAfter)
	if res.Stages != nil {
		r.logf("  %-12s %-22s %s", "", "", res.Stages)
	}
	if res.Bare != nil {
		r.logf("  %-12s %-22s bare producer, same window: p50 %.2f  p99 %.2f  max %.2f ms over %d records", "", "", res.Bare.P50Ms, res.Bare.P99Ms, res.Bare.MaxMs, res.Bare.Records)
	}
	return res
}

// analyse joins what was written with what arrived.
func analyse(res *latencyResult, rows []written, parts [][]receipt) {
	first := map[int64]stamp{}
	seen := 0
	for _, p := range parts {
		maxID := int64(0)
		lastByKey := map[int32]int64{}
		for _, rc := range p {
			if _, dup := first[rc.id]; dup {
				res.Duplicates++
				continue
			}
			first[rc.id] = rc.recv
			seen++
			if rc.id < maxID {
				res.LatePartition++
			}
			maxID = max(maxID, rc.id)
			if rc.id < lastByKey[rc.key] {
				res.LateKey++
			}
			lastByKey[rc.key] = max(lastByKey[rc.key], rc.id)
		}
	}
	lat := make([]float64, 0, len(rows))
	var t0 stamp
	if len(rows) > 0 {
		t0 = rows[0].commit
		for _, w := range rows {
			t0 = min(t0, w.commit)
		}
	}
	bySecond := map[int][]float64{}
	for _, w := range rows {
		recv, ok := first[w.id]
		if !ok {
			res.Missing++
			continue
		}
		res.Received++
		d := recv - w.commit
		if d < 0 {
			res.Negative++
			d = 0
		}
		lat = append(lat, float64(d)/1e6)
		sec := int((w.commit - t0) / 1e9)
		bySecond[sec] = append(bySecond[sec], float64(d)/1e6)
	}
	for sec := 0; sec < len(bySecond); sec++ {
		v := bySecond[sec]
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		res.PerSecondP50Ms = append(res.PerSecondP50Ms, math.Round(quantile(v, 0.5)*100)/100)
		res.PerSecondMaxMs = append(res.PerSecondMaxMs, math.Round(v[len(v)-1]*100)/100)
	}
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	res.P50Ms, res.P95Ms, res.P99Ms = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
	res.MaxMs = lat[len(lat)-1]
}

// quantile of sorted values: the smallest value with at least q of them at
// or below it.
func quantile(sorted []float64, q float64) float64 {
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// cellEnv is a cell's own database (migrated), topic (the plan's
// partitions) and a connection to the database; cleanup closes, deletes and
// drops them, last first. On an error nothing is left behind.
func (r *runner) cellEnv(ctx context.Context, prefix string) (db *database, topic string, conn *pgx.Conn, cleanup func(), err error) {
	if db, err = createDatabase(ctx, r.stack, prefix); err != nil {
		return nil, "", nil, nil, err
	}
	if topic, err = createTopic(r.stack, prefix, r.plan.Partitions); err != nil {
		db.drop()
		return nil, "", nil, nil, err
	}
	if conn, err = db.connect(ctx); err != nil {
		deleteTopic(r.stack, topic)
		db.drop()
		return nil, "", nil, nil, err
	}
	return db, topic, conn, func() {
		conn.Close(context.Background())
		deleteTopic(r.stack, topic)
		db.drop()
	}, nil
}
