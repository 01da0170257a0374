package main

// outboxd run --source=poll: the polling publisher (package poll) instead of
// the replication slot, for databases where logical replication is not
// available. The Kafka settings, topics, dead-letter topic, metrics and
// shutdown behave as with --source=cdc; the slot flags are ignored.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/poll"
)

const (
	sourceCDC      = "cdc"
	sourcePoll     = "poll"
	sourceMessages = "messages"
)

// pollOptions are the flags of --source=poll.
type pollOptions struct {
	source    string
	interval  time.Duration
	batchSize int
	workers   int
}

func addPollFlags(fs *flagSet, o *options) {
	d := poll.DefaultConfig()
	fs.StringVar(&o.poll.source, "source", sourceCDC, "where events come from: cdc (the replication slot: the outbox table's inserts, and outbox_emit messages on PostgreSQL 14+), messages (the slot, outbox_emit messages only: no outbox table; PostgreSQL 14+) or poll (SELECT ... FOR UPDATE SKIP LOCKED, no replication needed)", inShape,
		choices(sourceCDC, sourceMessages, sourcePoll))
	fs.DurationVar(&o.poll.interval, "poll-interval", d.Interval, "--source=poll: time between polls while fewer than --poll-batch-size rows wait", inPoll)
	fs.IntVar(&o.poll.batchSize, "poll-batch-size", d.BatchSize, "--source=poll: most rows one polling transaction publishes", inPoll)
	fs.IntVar(&o.poll.workers, "poll-workers", d.Workers, "--source=poll: concurrent polling transactions; more than 1 loses per-key order", inPoll)
}

func (o *options) pollConfig() (poll.Config, error) {
	c := poll.DefaultConfig()
	c.ConnString = o.pgDSN
	c.Schema, c.Table = o.slot.Schema, o.slot.Table
	c.Interval, c.BatchSize, c.Workers = o.poll.interval, o.poll.batchSize, o.poll.workers
	c.Mapping, c.DeadLetterTopic = o.pub.Mapping, o.pub.DeadLetterTopic
	c.ShutdownTimeout = o.pub.ShutdownTimeout
	c.RestartBackoffMin, c.RestartBackoffMax = o.pub.RestartBackoffMin, o.pub.RestartBackoffMax
	if o.poll.source != sourcePoll {
		return c, fmt.Errorf("--source %q: use %s or %s", o.poll.source, sourceCDC, sourcePoll)
	}
	return c, c.Validate()
}

// runPoll is cmdRun for --source=poll, after the common flags were checked
// and the logger built.
func runPoll(ctx context.Context, o *options, kcfg kafka.Config, logger *zap.Logger) error {
	cfg, err := o.pollConfig()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	// The same start rule as CDC (start.go): fail fast on what waiting
	// cannot fix, retry only once started.
	if err := kafka.Check(ctx, kcfg, o.startTimeout, logger); err != nil {
		return err
	}
	if err := checkPollTableAtStart(ctx, o, logger); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg)
	enc, err := o.formats.encoder(o, logger.Named("format"), reg)
	if err != nil {
		return err
	}
	if enc != nil {
		cfg.Encoder = enc
	}
	newHook, err := o.newHook()
	if err != nil {
		return err
	}
	poller, err := poll.NewKafka(cfg, kcfg, newHook, logger, poll.NewMetrics(reg))
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}

	var g run.Group
	{
		ctx, cancel := context.WithCancel(ctx)
		g.Add(func() error { return poller.Run(ctx) }, func(error) { cancel() })
	}
	g.Add(run.SignalHandler(ctx, os.Interrupt, syscall.SIGTERM))
	if err := addRetention(ctx, &g, o, true, reg, logger); err != nil {
		return err
	}
	if o.metricsAddr != "" {
		if err := addHTTPServer(&g, o.metricsAddr, pollHealthMux(reg, poller, o.pprof), logger); err != nil {
			return err
		}
	}
	return runGroup(&g, logger)
}

func pollHealthMux(reg *prometheus.Registry, p *poll.Poller, withPprof bool) *http.ServeMux {
	mux := baseMux(reg, withPprof)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if st := p.State(); st != outbox.StateStreaming {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %s\n", st)
			return
		}
		fmt.Fprintln(w, "ready: polling")
	})
	return mux
}
