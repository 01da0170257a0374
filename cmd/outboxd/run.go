package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/retention"
	"github.com/outboxd/outboxd/slot"
)

func cmdRun(ctx context.Context, args []string) error {
	var o options
	fs := newFlagSet("run", &o)
	addRunFlags(fs, &o)
	if err := parse(fs, args); err != nil {
		return err
	}
	return runCDC(ctx, &o, false)
}

// setup is what every command that publishes does first: validate run's
// settings (validateRun), build the logger, and point sarama's logger (a
// package global) at it.
func (o *options) setup() (kafka.Config, *zap.Logger, error) {
	kcfg, err := o.validateRun()
	if err != nil {
		return kcfg, nil, err
	}
	logger, err := o.logger(os.Stderr)
	if err != nil {
		return kcfg, nil, err
	}
	sarama.Logger = log.New(&zapWriter{logger.Named("sarama")}, "", 0)
	return kcfg, logger, nil
}

// runCDC is `outboxd run` with its options parsed (also after a replay,
// whose own prepare may have created the slot: createdBefore).
func runCDC(ctx context.Context, o *options, createdBefore bool) error {
	kcfg, logger, err := o.setup()
	if err != nil {
		return err
	}
	defer logger.Sync()
	if o.poll.source == sourcePoll { // the polling publisher: poll.go
		return runPoll(ctx, o, kcfg, logger)
	}
	setMemoryLimit(o.pub.MaxInFlightBytes, logger)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg)
	// The HTTP server before anything connects: a bad address fails here,
	// having created nothing, and /healthz answers during the checks.
	var httpSrv *httpServer
	if o.metricsAddr != "" {
		if httpSrv, err = listenHTTP(o.metricsAddr, startingMux(reg, o.pprof), logger); err != nil {
			return err
		}
		// Shutdown is idempotent: this covers the returns before the
		// group runs, which shuts the server down itself.
		defer httpSrv.close()
	}

	// Kafka first: an unreachable broker must not leave a new slot behind
	// (start.go says what fails fast).
	if err := kafka.Check(ctx, kcfg, o.startTimeout, logger); err != nil {
		return err
	}
	slotCreated, err := prepare(ctx, o, logger)
	if err != nil {
		return err
	}

	metrics := outbox.NewMetrics(reg)
	if o.pub.Encoder, err = o.formats.encoder(o, logger.Named("format"), reg); err != nil {
		return err
	}
	if topic := o.pub.CheckpointTopic; topic != "" {
		if err := kafka.EnsureCompactedTopic(kcfg, topic); err != nil {
			logger.Warn("checkpoint topic not ready; the sessions will retry", zap.String("topic", topic), zap.Error(err))
		}
	}
	fence := newFence()
	stream := o.streamConfig()
	stream.OnConfirm = fence.set
	w := publisher.Wiring{Stream: stream, Kafka: kcfg, SlotCreated: slotCreated || createdBefore}
	if w.NewHook, err = o.newHook(); err != nil {
		return err
	}
	svc := publisher.NewKafkaService(o.pub, w, logger, metrics)

	var g run.Group
	{ // The service: the data path.
		ctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return svc.Run(ctx) }, func(error) { cancel() })
	}
	{ // Signals: SIGINT/SIGTERM stop the group gracefully.
		g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	}
	if err := addRetention(ctx, &g, o, false, reg, logger); err != nil {
		return err
	}
	if o.auditInterval > 0 { // The continuous audit.
		cfg := audit.DefaultConfig()
		cfg.Schema, cfg.Table, cfg.Mapping = o.slot.Schema, o.slot.Table, o.pub.Mapping
		cfg.CheckContent = o.defaultRecordShape()
		l := &auditLoop{interval: o.auditInterval, delay: o.auditDelay, exactlyOnce: o.pub.Delivery == publisher.ExactlyOnce,
			dsn: o.pgDSN, kcfg: kcfg, cfg: cfg, state: svc.State, fence: fence,
			log: logger.Named("audit"), m: newAuditMetrics(reg), now: time.Now}
		actx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return l.run(actx) }, func(error) { cancel() })
	}
	if o.metricsAddr != "" { // Metrics and health.
		mux := healthMux(reg, svc, o.slot.Slot, o.stallTimeout, o.pprof)
		mux.HandleFunc("/published", fence.handlePublished(svc.State))
		httpSrv.setHandler(mux)
		httpSrv.add(&g)
		// The slot poller: lag bytes and retained WAL for the metrics.
		p := &slotPoller{dsn: o.pgDSN, cfg: o.slot, interval: o.slotPoll, m: metrics, log: logger.Named("slot-poller")}
		pctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return p.run(pctx) }, func(error) { cancel() })
	}
	return runGroup(&g, logger)
}

// addRetention adds the pruner actor when --retention is set; the polling
// source deletes only rows it published.
func addRetention(ctx context.Context, g *run.Group, o *options, publishedOnly bool, reg prometheus.Registerer, logger *zap.Logger) error {
	if o.retention.OlderThan <= 0 {
		return nil
	}
	cfg := o.retention
	cfg.Schema, cfg.Table, cfg.PublishedOnly = o.slot.Schema, o.slot.Table, publishedOnly
	p, err := retention.NewPruner(cfg, o.pgDSN, logger.Named("retention"), reg)
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	g.Add(func() error { return p.Run(ctx) }, func(error) { cancel() })
	return nil
}

// prepare checks the database and ensures the publication and the slot. It
// reports whether it created the slot.
func prepare(ctx context.Context, o *options, logger *zap.Logger) (slotCreated bool, err error) {
	err = withStartConn(ctx, o, logger, func(ctx context.Context, conn *pgx.Conn) error {
		if err := slot.Preflight(ctx, conn, o.slot, o.pub.DefaultTopic == ""); err != nil {
			return err
		}
		if sigs, err := slot.PublicEmitters(ctx, conn); err != nil {
			logger.Warn("could not check who may execute pg_logical_emit_message", zap.Error(err))
		} else if w := slot.EmitWarning(sigs); w != "" {
			logger.Warn(w)
		}
		created, err := slot.Ensure(ctx, conn, o.slot, !o.noCreate)
		if err != nil {
			return err
		}
		for _, c := range created {
			logger.Info("created", zap.String("object", c))
			slotCreated = slotCreated || strings.HasPrefix(c, "replication slot ")
		}
		return nil
	})
	return slotCreated, err
}

// healthMux serves /metrics, /healthz (the process answers) and /readyz:
// 200 while streaming as the active instance or waiting as a healthy standby
// (the body says which), 503 while starting, restarting after an error, or
// stopped.
func healthMux(reg *prometheus.Registry, svc *publisher.Service, slotName string, stallTimeout time.Duration, withPprof bool) *http.ServeMux {
	mux := baseMux(reg, withPprof)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := svc.State()
		switch st {
		case outbox.StateStreaming:
			if d := svc.Stalled(); d > stallTimeout {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: stalled: events have waited %s for Kafka with none acknowledged (--stall-timeout %s)\n",
					d.Round(time.Second), stallTimeout)
				return
			}
			fmt.Fprintf(w, "ready: active, streaming from slot %q\n", slotName)
		case outbox.StateStandby:
			fmt.Fprintf(w, "ready: standby, another process holds slot %q\n", slotName)
		case outbox.StateRestarting:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: restarting after an error")
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %s\n", st)
		}
	})
	return mux
}

// zapWriter adapts sarama's log.Logger to zap at debug level.
type zapWriter struct{ l *zap.Logger }

func (w *zapWriter) Write(p []byte) (int, error) {
	if ce := w.l.Check(zap.DebugLevel, string(trimNewline(p))); ce != nil {
		ce.Write()
	}
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}
