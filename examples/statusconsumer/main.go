// Command statusconsumer is the consumer of the outboxd demo: it keeps an
// order-status projection (table order_status) from the order and status
// events, with package consumer's deduplication, retries and dead-letter
// topics. It prints one line per event:
//
//	INSERT  the event was applied (its transaction committed)
//	DUP     the event was processed before: skipped
//	DLQ     the event was refused (invalid transition, malformed, or transient
//	        failures past the retries) and is in <topic>.dlq
//
// and, when it stops (SIGINT/SIGTERM), the totals:
//
//	processed=N inserted=N skipped=N dlq=N
//
// It exits 0 after a signal, 1 on an error (such as a dead-letter topic that
// cannot be written: the message stays uncommitted for the next run), and 3
// when --crash-after-commit made it crash.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/examples/internal/brew"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "statusconsumer:", err)
		}
		os.Exit(1)
	}
}

type options struct {
	dsn, brokers, topics, logLevel string
	crashAfterCommit               int
	cfg                            consumer.Config
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{cfg: consumer.DefaultConfig()}
	o.cfg.GroupID = "statusconsumer"
	fs := flag.NewFlagSet("statusconsumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dsn, "pg-dsn", os.Getenv("OUTBOXD_PG_DSN"), "PostgreSQL connection string (env OUTBOXD_PG_DSN)")
	fs.StringVar(&o.brokers, "kafka-brokers", os.Getenv("OUTBOXD_KAFKA_BROKERS"), "Kafka brokers host:port[,...] (env OUTBOXD_KAFKA_BROKERS)")
	fs.StringVar(&o.topics, "topics", brew.OrdersTopic+","+brew.StatusTopic, "topics to consume, comma-separated; each has its dead-letter topic <topic>.dlq")
	fs.StringVar(&o.cfg.GroupID, "group", o.cfg.GroupID, "Kafka consumer group")
	fs.IntVar(&o.cfg.MaxRetries, "max-retries", o.cfg.MaxRetries, "retries of a transient failure before the message is dead-lettered")
	fs.DurationVar(&o.cfg.BackoffBase, "backoff-base", o.cfg.BackoffBase, "wait after the first failed attempt; doubles after each")
	fs.DurationVar(&o.cfg.BackoffMax, "backoff-max", o.cfg.BackoffMax, "cap of the retry backoff")
	fs.DurationVar(&o.cfg.CommitInterval, "commit-interval", o.cfg.CommitInterval, "how often done offsets are committed (0: after every message)")
	fs.DurationVar(&o.cfg.SessionTimeout, "session-timeout", o.cfg.SessionTimeout, "consumer group session timeout")
	fs.IntVar(&o.crashAfterCommit, "crash-after-commit", 0, "DEMO/TEST ONLY: exit hard (status 3) once this many messages are done in Postgres, before their offsets are committed")
	o.cfg.Security.AddFlags(fs) // --kafka-tls-*, --kafka-sasl-*: the same as outboxd's
	fs.StringVar(&o.logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, t := range strings.Split(o.topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			o.cfg.Topics = append(o.cfg.Topics, t)
		}
	}
	for _, b := range strings.Split(o.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.cfg.Brokers = append(o.cfg.Brokers, b)
		}
	}
	var errs []error
	if o.dsn == "" {
		errs = append(errs, errors.New("no --pg-dsn (or OUTBOXD_PG_DSN)"))
	}
	if o.crashAfterCommit < 0 {
		errs = append(errs, errors.New("--crash-after-commit must be ≥ 0"))
	}
	if err := o.cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	var level zapcore.Level
	if err := level.Set(o.logLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(stderr), level))
	defer func() { _ = logger.Sync() }()
	if sl, err := zap.NewStdLogAt(logger.Named("sarama"), zapcore.DebugLevel); err == nil {
		sarama.Logger = sl // a package global: set once, here in main
	}

	poolCfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return fmt.Errorf("--pg-dsn: %w", err)
	}
	poolCfg.MaxConns = 16 // one transaction per partition in flight
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()

	p := &printer{w: stdout, crashAfter: int64(o.crashAfterCommit)}
	o.cfg.OnDone = p.done
	c, err := consumer.New(o.cfg, pool, projection{}, logger)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "consuming %s as group %s\n", strings.Join(o.cfg.Topics, ", "), o.cfg.GroupID)
	runErr := c.Run(ctx)
	st := c.Stats()
	p.printf("processed=%d inserted=%d skipped=%d dlq=%d\n", st.Done, st.Processed, st.Duplicates, st.DeadLettered)
	return runErr
}

// printer writes the per-event lines; partitions are processed on their own
// goroutines, so lines are serialized.
type printer struct {
	mu         sync.Mutex
	w          io.Writer
	crashAfter int64
	count      atomic.Int64
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// done prints one line per event. It runs after the event is durable and
// before its offset is marked, which is where --crash-after-commit strikes.
func (p *printer) done(m *consumer.Message, r consumer.Result) {
	var ev struct {
		Type   string `json:"type"`
		Status string `json:"status"`
	}
	_ = json.Unmarshal(m.Value, &ev) // best effort: a malformed one is in the DLQ line's error
	what := fmt.Sprintf("outbox-id=%d %s %s status=%s (%s)", m.OutboxID, m.Key, ev.Type, ev.Status, m)
	switch r.Outcome {
	case consumer.Processed:
		p.printf("INSERT %s\n", what)
	case consumer.Duplicate:
		p.printf("DUP    %s\n", what)
	case consumer.DeadLettered:
		p.printf("DLQ    %s class=%s attempts=%d error=%q -> %s/%d@%d\n", what, r.Class, r.Attempts, r.Err,
			r.DeadLetterTopic, r.DeadLetterPartition, r.DeadLetterOffset)
	}
	if n := p.count.Add(1); p.crashAfter > 0 && n >= p.crashAfter {
		p.printf("CRASH after %d messages done in Postgres, before their offsets are committed (--crash-after-commit)\n", n)
		os.Exit(3) // as a kill would: no deferred function runs, no offset is committed
	}
}
