package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

// profileDrains drains the plan's backlog in this process, wired as
// outboxd run wires it, once by the replication reader alone, once by CDC
// and once by the poller, each under the CPU profiler, and writes
// <name>.cpu.prof and <name>.allocs.prof into dir plus a top-25 summary.
func profileDrains(ctx context.Context, st stack, p plan, dir string, logf func(string, ...any)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	sx, err := newScratch(ctx, st, "profile", p.Partitions)
	if err != nil {
		return err
	}
	defer sx.close()
	db, conn, topic := sx.db, sx.conn, sx.topic
	kc, err := sarama.NewClient(st.Brokers, kafkaConfig())
	if err != nil {
		return err
	}
	defer kc.Close()
	slots := map[string]string{"reader": testenv.UniqueName("prof_reader"), "cdc": testenv.UniqueName("prof_cdc")}
	pub := testenv.UniqueName("prof")
	for _, s := range slots {
		if _, err := sx.slot(ctx, s, pub); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if err := preload(ctx, db.DSN, topic, p.DrainRows, p.DrainTxRows, p.Aggregates, p.PayloadBytes); err != nil {
		return err
	}
	logf("preloaded %d rows in %.1fs (load %.2f)", p.DrainRows, time.Since(t0).Seconds(), loadAvg())
	stream := func(slotName string) replication.StreamConfig { return profileStream(db.DSN, slotName, pub) }
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = st.Brokers

	// profiled runs start under the profiler and returns once done says so.
	profiled := func(name string, start func(ctx context.Context) <-chan error, done func() bool) error {
		f, err := os.Create(filepath.Join(dir, name+".cpu.prof"))
		if err != nil {
			return err
		}
		defer f.Close()
		runtime.GC()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		began := time.Now()
		rctx, cancel := context.WithCancel(ctx)
		errc := start(rctx)
		for !done() {
			select {
			case err := <-errc:
				pprof.StopCPUProfile()
				cancel()
				return fmt.Errorf("%s stopped early: %v", name, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		secs := time.Since(began).Seconds()
		pprof.StopCPUProfile()
		var ms1 runtime.MemStats
		runtime.ReadMemStats(&ms1)
		cancel()
		<-errc
		logf("%-7s %d rows in %.2fs = %.0f ev/s; %.0f allocs and %.0f bytes allocated per event; %d GCs; load %.2f",
			name, p.DrainRows, secs, float64(p.DrainRows)/secs,
			float64(ms1.Mallocs-ms0.Mallocs)/float64(p.DrainRows), float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(p.DrainRows),
			ms1.NumGC-ms0.NumGC, loadAvg())
		af, err := os.Create(filepath.Join(dir, name+".allocs.prof"))
		if err != nil {
			return err
		}
		defer af.Close()
		if err := pprof.Lookup("allocs").WriteTo(af, 0); err != nil {
			return err
		}
		return top(dir, name)
	}

	// The reader alone: what the ceiling measures.
	var events int
	err = profiled("reader", func(ctx context.Context) <-chan error {
		errc := make(chan error, 1)
		go func() {
			s, err := replication.Open(ctx, stream(slots["reader"]), zap.NewNop())
			if err != nil {
				errc <- err
				return
			}
			defer s.Close()
			prog := &confirmAsRead{done: make(chan struct{})}
			out := make(chan replication.Message, 1024)
			res := make(chan error, 1)
			go func() { res <- s.Run(ctx, out, prog, nil) }()
			for m := range out {
				switch m.Kind {
				case replication.KindEvent:
					events++
				case replication.KindCommit:
					prog.lsn.Store(uint64(m.Commit.EndLSN))
				}
			}
			close(prog.done)
			errc <- <-res
		}()
		return errc
	}, func() bool { return events >= p.DrainRows })
	if err != nil {
		return err
	}

	inKafka := func(want int64) func() bool {
		return func() bool {
			n, err := highWatermarks(kc, topic)
			return err == nil && n >= want
		}
	}
	pcfg := publisher.DefaultConfig()
	pcfg.ShutdownTimeout = 10 * time.Second
	err = profiled("cdc", func(ctx context.Context) <-chan error {
		errc := make(chan error, 1)
		svc := publisher.NewKafkaService(pcfg, publisher.Wiring{Stream: stream(slots["cdc"]), Kafka: kcfg}, zap.NewNop(), nil)
		go func() { errc <- svc.Run(ctx) }()
		return errc
	}, inKafka(int64(p.DrainRows)))
	if err != nil {
		return err
	}
	for _, s := range slots {
		_ = execSQL(ctx, conn, "SELECT pg_drop_replication_slot($1)", s)
	}

	if err := profileSteady(ctx, st, p, dir, logf); err != nil {
		return err
	}
	for _, l := range []load{{5000, 1}, {5000, 10}} {
		if err := readerLag(ctx, st, p, l, logf); err != nil {
			return err
		}
	}
	err = profiled("poll", func(ctx context.Context) <-chan error {
		errc := make(chan error, 1)
		cfg := poll.DefaultConfig()
		cfg.ConnString = db.DSN
		poller, err := poll.NewKafka(cfg, kcfg, nil, zap.NewNop(), nil)
		if err != nil {
			errc <- err
			return errc
		}
		go func() { errc <- poller.Run(ctx) }()
		return errc
	}, inKafka(2*int64(p.DrainRows)))
	return err
}

// scratch is what one profiling run writes to: a database of its own with
// a connection to it and, unless partitions is 0, a topic; close removes
// them.
type scratch struct {
	st    stack
	db    *database
	conn  *pgx.Conn
	topic string
}

func newScratch(ctx context.Context, st stack, prefix string, partitions int32) (*scratch, error) {
	db, err := createDatabase(ctx, st, prefix)
	if err != nil {
		return nil, err
	}
	sx := &scratch{st: st, db: db}
	if partitions > 0 {
		if sx.topic, err = createTopic(st, prefix, partitions); err != nil {
			sx.close()
			return nil, err
		}
	}
	if sx.conn, err = db.connect(ctx); err != nil {
		sx.close()
		return nil, err
	}
	return sx, nil
}

func (sx *scratch) close() {
	if sx.conn != nil {
		sx.conn.Close(context.Background())
	}
	if sx.topic != "" {
		deleteTopic(sx.st, sx.topic)
	}
	_ = sx.db.drop()
}

// slot creates a replication slot and a publication in the database.
func (sx *scratch) slot(ctx context.Context, name, publication string) (slot.Config, error) {
	sc := slot.DefaultConfig()
	sc.Slot, sc.Publication = name, publication
	_, err := slot.Ensure(ctx, sx.conn, sc, true)
	return sc, err
}

// profileStream is the replication connection of the in-process runs.
func profileStream(dsn, slotName, publication string) replication.StreamConfig {
	return replication.StreamConfig{ConnString: dsn, Slot: slotName, Publication: publication, StatusInterval: time.Second,
		Decoder: replication.DecoderConfig{Columns: replication.DefaultColumns()}}
}

// top writes go tool pprof's top 25, flat and cumulative, next to a profile.
func top(dir, name string) error {
	prof := filepath.Join(dir, name+".cpu.prof")
	for suffix, args := range map[string][]string{
		".top.txt":    {"tool", "pprof", "-top", "-nodecount=25", prof},
		".topcum.txt": {"tool", "pprof", "-top", "-cum", "-nodecount=25", prof},
	} {
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("go tool pprof: %v: %s", err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, name+suffix), out, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// profileSteady profiles CDC in this process at 1,000 events/s in 10-row
// transactions for the plan's duration: where a steady load spends CPU.
func profileSteady(ctx context.Context, st stack, p plan, dir string, logf func(string, ...any)) error {
	sx, err := newScratch(ctx, st, "profile", p.Partitions)
	if err != nil {
		return err
	}
	defer sx.close()
	db, topic := sx.db, sx.topic
	sc, err := sx.slot(ctx, testenv.UniqueName("prof_steady"), testenv.UniqueName("prof"))
	if err != nil {
		return err
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = st.Brokers
	pcfg := publisher.DefaultConfig()
	pcfg.ShutdownTimeout = 10 * time.Second
	svc := publisher.NewKafkaService(pcfg, publisher.Wiring{Stream: profileStream(db.DSN, sc.Slot, sc.Publication), Kafka: kcfg}, zap.NewNop(), nil)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(rctx) }()
	clk := clock{base: time.Now()}
	if _, err := writeLoad(ctx, db.DSN, clk, topic, 200, 10, 2, p.Aggregates, p.PayloadBytes, 2*time.Second); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "cdc-1000.cpu.prof"))
	if err != nil {
		return err
	}
	defer f.Close()
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	rows, err := writeLoad(ctx, db.DSN, clk, topic, 1000, 10, 4, p.Aggregates, p.PayloadBytes, p.Duration)
	time.Sleep(500 * time.Millisecond)
	pprof.StopCPUProfile()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if err != nil {
		return err
	}
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	logf("cdc-1000: %d rows at 1000 ev/s; this process (publisher + writer) used %.0f ms CPU per 1k events; load %.2f",
		len(rows), cpu.Seconds()*1e6/float64(len(rows)), loadAvg())
	cancel()
	<-errc
	return top(dir, "cdc-1000")
}

// readerLag runs the replication reader alone (no Kafka) at a steady load
// and logs commit → read per second: whether PostgreSQL and the reader keep
// up by themselves.
func readerLag(ctx context.Context, st stack, p plan, l load, logf func(string, ...any)) error {
	sx, err := newScratch(ctx, st, "lag", 0)
	if err != nil {
		return err
	}
	defer sx.close()
	db := sx.db
	sc, err := sx.slot(ctx, testenv.UniqueName("lag"), testenv.UniqueName("lag"))
	if err != nil {
		return err
	}
	s, err := replication.Open(ctx, profileStream(db.DSN, sc.Slot, sc.Publication), zap.NewNop())
	if err != nil {
		return err
	}
	defer s.Close()
	prog := &confirmAsRead{done: make(chan struct{})}
	out := make(chan replication.Message, 1024)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(rctx, out, prog, nil) }()
	bySec := map[int][]float64{}
	read := make(chan struct{})
	began := time.Now()
	go func() {
		defer close(read)
		var commit time.Time
		for m := range out {
			switch m.Kind {
			case replication.KindBegin:
				commit = m.Begin.CommitTime
			case replication.KindEvent:
				now := time.Now()
				sec := int(now.Sub(began).Seconds())
				bySec[sec] = append(bySec[sec], float64(now.Sub(commit).Microseconds())/1000)
			case replication.KindCommit:
				prog.lsn.Store(uint64(m.Commit.EndLSN))
			}
		}
	}()
	if _, err := writeLoad(ctx, db.DSN, clock{base: began}, "lag", l.Rate, l.TxRows, l.writers(), p.Aggregates, p.PayloadBytes, p.Duration); err != nil {
		return err
	}
	time.Sleep(time.Second)
	cancel()
	<-read
	close(prog.done)
	<-runErr
	var all []float64
	for sec := 0; sec < len(bySec); sec++ {
		v := bySec[sec]
		slices.Sort(v)
		all = append(all, v...)
		if len(v) > 0 {
			logf("reader alone at %s, second %2d: %5d events, commit→read p50 %7.2f ms, max %7.2f ms", l, sec, len(v), quantile(v, 0.5), v[len(v)-1])
		}
	}
	slices.Sort(all)
	if len(all) > 0 {
		logf("reader alone at %s: commit→read p50 %.2f ms, p99 %.2f ms, max %.2f ms; load %.2f",
			l, quantile(all, 0.5), quantile(all, 0.99), all[len(all)-1], loadAvg())
	}
	return nil
}
