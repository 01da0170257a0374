package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// maxAuditWindow bounds the rows one round of the continuous audit reads:
// after a pause (standby, a round skipped while lagging) the rounds catch
// up an hour at a time rather than reading everything since.
const maxAuditWindow = time.Hour

// auditLoop is run's continuous audit (--audit-interval): every interval,
// while this process is the active one, it audits the rows created in the
// window since its last round, up to --audit-delay ago, with the same
// verdicts as "outboxd audit --since", and exports what it found.
//
// A round judges only rows that must be in Kafka: it reads the server's WAL
// position first and waits (up to the interval) for this process to have
// confirmed past it, so every row committed before that position is
// published; a round that cannot (outboxd lagging) is skipped and its window
// kept for the next. A row whose transaction was open across that position
// for longer than --audit-delay (created before the window's end, committed
// after the position) can be reported missing by one round: a false alarm
// the "outboxd audit" command line it logs settles.
//
// What it costs: one round reads the records of every outbox topic from
// the window's start to the high watermark (interval + delay of traffic)
// and the window's rows; the audit takes about 2.2 s of CPU per million
// records (make bench-audit), so 1,000 events/s audited every minute with
// a one-minute delay cost about 0.3 s of CPU a minute.
type auditLoop struct {
	interval, delay time.Duration
	exactlyOnce     bool // duplicates are a verdict
	dsn             string
	kcfg            kafka.Config
	cfg             audit.Config // the shape and table; the window is set per round
	state           func() outbox.State
	fence           *fence
	log             *zap.Logger
	m               auditMetrics
	now             func() time.Time
}

type auditMetrics struct {
	runs      *prometheus.CounterVec // by result
	verdicts  *prometheus.CounterVec // by verdict
	rows      prometheus.Counter
	lastClean prometheus.Gauge
	windowEnd prometheus.Gauge
}

func newAuditMetrics(reg prometheus.Registerer) auditMetrics {
	m := auditMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_audit_runs_total",
			Help: "Rounds of the continuous audit (--audit-interval) by result: clean, verdict (something found), skipped (outboxd lagging, or not the active instance), error."}, []string{"result"}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outboxd_audit_verdicts_total",
			Help: "Events the continuous audit found wrong, by verdict: missing, duplicate (at-least-once makes them), reorder, mismatch, unknown (a record with no row)."}, []string{"verdict"}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "outboxd_audit_rows_total",
			Help: "Outbox rows the continuous audit checked against Kafka."}),
		lastClean: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_audit_last_clean_timestamp_seconds",
			Help: "Unix time of the last round of the continuous audit that found nothing but, in at-least-once, duplicates."}),
		windowEnd: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outboxd_audit_window_end_timestamp_seconds",
			Help: "created_at up to which the continuous audit has checked the rows (Unix time)."}),
	}
	for _, r := range []string{"clean", "verdict", "skipped", "error"} {
		m.runs.WithLabelValues(r)
	}
	for _, v := range []string{"missing", "duplicate", "reorder", "mismatch", "unknown"} {
		m.verdicts.WithLabelValues(v)
	}
	reg.MustRegister(m.runs, m.verdicts, m.rows, m.lastClean, m.windowEnd)
	return m
}

func (l *auditLoop) run(ctx context.Context) error {
	ticker := time.NewTicker(l.interval)
	defer ticker.Stop()
	w := auditWindows{from: l.now().Add(-l.delay), delay: l.delay}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if l.state() != outbox.StateStreaming {
			l.m.runs.WithLabelValues("skipped").Inc()
			continue
		}
		since, until, ok := w.next(l.now())
		if !ok {
			continue
		}
		done, err := l.round(ctx, since, until)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			l.m.runs.WithLabelValues("error").Inc()
			l.log.Warn("continuous audit: round failed; its window is audited again next round", zap.Error(err))
		case done:
			w.from = until
			l.m.windowEnd.Set(float64(until.UnixNano()) / 1e9)
		}
	}
}

// auditWindows hands out the continuous audit's windows of created_at:
// each starts where the last audited one ended (from), and a window whose
// round was skipped is kept, so no row is left out. The first starts at the
// loop's start minus the delay: before, a skipped first round slid it
// forward and the rows created meanwhile were never audited.
type auditWindows struct {
	from  time.Time // the end of the last window audited
	delay time.Duration
}

// next is the window to audit at now: from the last one's end to delay
// ago, at most maxAuditWindow long; ok is false when it is empty.
func (w *auditWindows) next(now time.Time) (since, until time.Time, ok bool) {
	since, until = w.from, now.Add(-w.delay)
	if until.Sub(since) > maxAuditWindow {
		until = since.Add(maxAuditWindow)
	}
	return since, until, until.After(since)
}

// round audits the rows created in [since, until); done is false when it was
// skipped (outboxd has not confirmed the server's position within the
// interval).
func (l *auditLoop) round(ctx context.Context, since, until time.Time) (done bool, err error) {
	conn, err := pgx.Connect(ctx, l.dsn)
	if err != nil {
		return false, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if ok, err := l.confirmedNow(ctx, conn); err != nil || !ok {
		return false, err
	}
	cfg := l.cfg
	// Records are read from a delay before the window: the rows of the
	// window's id range include rows of transactions that began (their
	// created_at) a little before it.
	cfg.Since, cfg.Until, cfg.FromOffsetTime = since, until, since.Add(-l.delay)
	rep, err := audit.Run(ctx, conn, l.kcfg, cfg)
	if err != nil {
		return false, err
	}
	if rep.MissingCount() > 0 {
		// Rows committed between the position read above and the audit's
		// snapshot were seen without being confirmed: wait for a position
		// read now and audit once more; what is missing still is missing.
		if ok, err := l.confirmedNow(ctx, conn); err != nil || !ok {
			return false, err
		}
		if rep, err = audit.Run(ctx, conn, l.kcfg, cfg); err != nil {
			return false, err
		}
	}
	var rows int64
	for i := range rep.Topics {
		t := &rep.Topics[i]
		rows += t.Rows
		l.m.verdicts.WithLabelValues("missing").Add(float64(t.Missing.Count))
		l.m.verdicts.WithLabelValues("duplicate").Add(float64(t.Duplicates()))
		l.m.verdicts.WithLabelValues("reorder").Add(float64(t.Reorders.Count))
		l.m.verdicts.WithLabelValues("mismatch").Add(float64(t.Mismatches.Count))
		l.m.verdicts.WithLabelValues("unknown").Add(float64(t.Unknown.Count))
	}
	l.m.rows.Add(float64(rows))
	if rep.CleanIgnoring(l.duplicatesAllowed()) {
		l.m.runs.WithLabelValues("clean").Inc()
		l.m.lastClean.SetToCurrentTime()
		return true, nil
	}
	l.m.runs.WithLabelValues("verdict").Inc()
	l.log.Error("continuous audit: events not delivered as promised; see and repair them with the command given",
		zap.Strings("verdicts", rep.Verdicts), zap.Int64("rows", rows),
		zap.String("command", fmt.Sprintf("outboxd audit --since %s --until %s --from-offset-time %s (with run's settings; --repair republishes the missing)",
			since.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano), since.UTC().Format(time.RFC3339Nano))))
	return true, nil
}

// confirmedNow reads the server's WAL position and waits, up to the
// interval, for this process to confirm past it: every row committed
// before then is in Kafka. It reports false (a round skipped, counted and
// logged) when outboxd lags.
func (l *auditLoop) confirmedNow(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pos string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&pos); err != nil {
		return false, fmt.Errorf("read the WAL position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(pos)
	if err != nil {
		return false, fmt.Errorf("read the WAL position %q: %w", pos, err)
	}
	wctx, cancel := context.WithTimeout(ctx, l.interval)
	defer cancel()
	if ok, confirmed := l.fence.wait(wctx, lsn); !ok {
		l.m.runs.WithLabelValues("skipped").Inc()
		l.log.Info("continuous audit: outboxd has not confirmed the server's position yet; round skipped, its window kept",
			zap.Stringer("wal", lsn), zap.Stringer("confirmed", confirmed))
		return false, nil
	}
	return true, nil
}

// duplicatesAllowed: at-least-once delivery makes duplicates after a crash
// or a restart; they are counted, not a verdict of the round.
func (l *auditLoop) duplicatesAllowed() bool { return !l.exactlyOnce }
