package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

// The bare replication reader as a source (the floor of the sustained
// rate): the reader alone (replication.Open + Stream.Run: receive, decode,
// confirm each commit as read; no Kafka) in a process of its own, through
// the same rate search as outboxd. Its latency is commit return → the
// reader has the event; outboxd's is commit return → the record in Kafka,
// so outboxd's sustained rate over the reader's is what publishing to Kafka
// costs.

const readerName = "reader (no Kafka)"

// readerMain is the child: it streams from the slot and appends (outbox id,
// wall-clock ns) per event to -out, flushed every 100 ms, until SIGTERM.
func readerMain(args []string) int {
	fs := flag.NewFlagSet("reader", flag.ContinueOnError)
	dsn := fs.String("dsn", "", "database DSN")
	slotName := fs.String("slot", "", "slot")
	pub := fs.String("publication", "", "publication")
	outPath := fs.String("out", "", "file for (id, ns) records")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	f, err := os.Create(*outPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	defer f.Close()
	s, err := replication.Open(ctx, replication.StreamConfig{
		ConnString: *dsn, Slot: *slotName, Publication: *pub, StatusInterval: time.Second,
		Decoder: replication.DecoderConfig{Columns: replication.DefaultColumns()},
	}, zap.NewNop())
	if err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	defer s.Close()
	prog := &confirmAsRead{done: make(chan struct{})}
	out := make(chan replication.Message, 1024)
	runErr := make(chan error, 1)
	go func() { runErr <- s.Run(ctx, out, prog, nil) }()
	w := bufio.NewWriterSize(f, 1<<16)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var rec [16]byte
	for open := true; open; {
		select {
		case m, ok := <-out:
			if !ok {
				open = false
				break
			}
			switch m.Kind {
			case replication.KindEvent:
				binary.LittleEndian.PutUint64(rec[:8], uint64(m.Event.ID))
				binary.LittleEndian.PutUint64(rec[8:], uint64(time.Now().UnixNano()))
				w.Write(rec[:])
			case replication.KindCommit:
				prog.lsn.Store(uint64(m.Commit.EndLSN))
			}
		case <-tick.C:
			w.Flush()
		}
	}
	close(prog.done)
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	if err := <-runErr; err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		return 1
	}
	return 0
}

// readerReceipts reads the child's file: receipts on clk.
func readerReceipts(path string, clk clock) ([]receipt, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	base := clk.base.UnixNano()
	out := make([]receipt, 0, len(b)/16)
	for i := 0; i+16 <= len(b); i += 16 {
		out = append(out, receipt{id: int64(binary.LittleEndian.Uint64(b[i:])), recv: int64(binary.LittleEndian.Uint64(b[i+8:])) - base})
	}
	return out, nil
}

func fileRecords(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size() / 16
}

// readerCell is latencyCell for the bare reader: a database, slot and
// publication of its own, the reader child on them, a warm-up, the
// window, then every row read.
func (r *runner) readerCell(ctx context.Context, l load) (res latencyResult) {
	res = latencyResult{Source: readerName, Load: l, Writers: l.writers(), LoadBefore: loadAvg(), ExitCode: -1}
	defer func() { res.LoadAfter = loadAvg() }()
	fail := func(err error) latencyResult {
		res.Err = err.Error()
		r.logf("  %s at %s: %v", readerName, l, err)
		return res
	}
	db, err := createDatabase(ctx, r.stack, "reader")
	if err != nil {
		return fail(err)
	}
	defer db.drop()
	conn, err := db.connect(ctx)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.Background())
	name := testenv.UniqueName("reader")
	sc := slot.DefaultConfig()
	sc.Slot, sc.Publication = name, name
	if _, err := slot.Ensure(ctx, conn, sc, true); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp("", "outboxd-bench-reader-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	path := tmp + "/receipts"
	clk := clock{base: time.Now()}
	child, err := testproc.Launch(r.self, []string{"-dsn", db.DSN, "-slot", name, "-publication", name, "-out", path}, childEnv+"=reader")
	if err != nil {
		return fail(err)
	}
	defer child.Terminate(30 * time.Second)
	started := time.Now()
	for deadline := started.Add(60 * time.Second); !slotActive(ctx, conn, name); {
		if child.Exited() || time.Now().After(deadline) {
			return fail(fmt.Errorf("reader not streaming within 60s: %s", child.Tail(5)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every row in the table is in the slot (made before the first); wait
	// until the file holds as many events as the table has rows.
	caughtUp := func(timeout time.Duration) bool {
		for deadline := time.Now().Add(timeout); ; {
			var n int64
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err == nil && fileRecords(path) >= n {
				return true
			}
			if child.Exited() || time.Now().After(deadline) {
				return false
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if _, err := writeLoad(ctx, db.DSN, clk, "reader", min(l.Rate, 500), 1, 2, r.plan.Aggregates, r.plan.PayloadBytes, time.Second); err != nil {
		return fail(err)
	}
	if !caughtUp(60 * time.Second) {
		return fail(fmt.Errorf("warm-up: reader did not read every row in 60s: %s", child.Tail(5)))
	}
	res.StartupSeconds = time.Since(started).Seconds()
	pids, err := publisherBackends(ctx, conn, db.Database)
	if err != nil {
		return fail(err)
	}
	cpu0, err := testproc.CPUTime(child.PID())
	if err != nil {
		return fail(err)
	}
	pg0 := backendsCPU(pids)
	mach0 := sampleCPU(child.PID(), pids)
	began := time.Now()
	rows, err := writeLoad(ctx, db.DSN, clk, "reader", l.Rate, l.TxRows, l.writers(), r.plan.Aggregates, r.plan.PayloadBytes, r.plan.Duration)
	if err != nil {
		return fail(err)
	}
	res.WriteSeconds = time.Since(began).Seconds()
	res.Written = len(rows)
	res.AchievedRate = float64(len(rows)) / res.WriteSeconds
	res.CPUShares = shares(mach0, sampleCPU(child.PID(), pids), "reader")
	complete := caughtUp(60 * time.Second)
	if cpu1, err := testproc.CPUTime(child.PID()); err == nil {
		res.CPUSeconds = (cpu1 - cpu0).Seconds()
		res.CPUMsPer1k = res.CPUSeconds * 1e6 / float64(max(1, len(rows)))
	}
	res.PGCPUSeconds = (backendsCPU(pids) - pg0).Seconds()
	if rss, err := testproc.PeakRSS(child.PID()); err == nil {
		res.PeakRSSMiB = float64(rss) / (1 << 20)
	}
	res.ExitCode = child.Terminate(30 * time.Second)
	if res.ExitCode != 0 {
		res.Err = fmt.Sprintf("reader exited %d: %s", res.ExitCode, child.Tail(5))
	}
	recs, err := readerReceipts(path, clk)
	if err != nil {
		return fail(err)
	}
	analyse(&res, rows, [][]receipt{recs})
	if !complete && res.Err == "" {
		res.Err = fmt.Sprintf("%d of %d rows not read within 60s", res.Missing, res.Written)
	}
	res.LoadAfter = loadAvg()
	r.logf("  %-12s %-22s p50 %7.2f  p99 %7.2f  max %7.2f ms  %6.0f ev/s  cpu %5.1f ms/1k  walsender %.2f cores  load %.2f",
		"reader", l, res.P50Ms, res.P99Ms, res.MaxMs, res.AchievedRate, res.CPUMsPer1k, res.CPUShares["walsender"], res.LoadAfter)
	return res
}
