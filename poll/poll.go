package poll

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"go.uber.org/zap"
	"sync"
	"sync/atomic"
	"time"
)

// Deps are the factories a Poller calls at every (re)start.
type Deps struct {
	// NewProducer connects a producer; one per session, shared by the
	// workers. Required.
	NewProducer func() (outbox.Producer, error)
	// NewDeadLetterer, when set, connects the dead-letter producer: poison
	// rows go there and are marked published. Without it a poison row halts
	// the poller. If the value is an io.Closer it is closed with the session.
	NewDeadLetterer func() (outbox.DeadLetterer, error)
	// NewHook, when set, connects a post-publish hook, one per worker: it
	// runs for every row Kafka acknowledged, before the batch is marked
	// published; a failure rolls the batch back, so the rows are sent
	// again and the hook runs again (it must be idempotent). If the value
	// is an io.Closer it is closed with the session.
	NewHook func(ctx context.Context) (outbox.Hook, error)
}

// Poller publishes outbox rows by polling, as a source under a
// outbox.Supervisor. A Poller runs once.
type Poller struct {
	cfg   Config
	pgcfg *pgx.ConnConfig
	log   *zap.Logger
	m     *Metrics
	deps  Deps
	sup   *outbox.Supervisor
	// unseen is used by the first worker of each session only.
	unseen *unseenDeletes
}

// New builds a poller. m may be nil.
func New(cfg Config, log *zap.Logger, m *Metrics, deps Deps) (*Poller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.NewProducer == nil {
		return nil, errors.New("poll: Deps.NewProducer is required")
	}
	pgcfg, err := pgx.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("poll: PostgreSQL connection string: %w", err)
	}
	if pgcfg.RuntimeParams["application_name"] == "" {
		pgcfg.RuntimeParams["application_name"] = "outboxd-poll"
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	if log == nil {
		log = zap.NewNop()
	}
	p := &Poller{cfg: cfg, pgcfg: pgcfg, log: log, m: m, deps: deps,
		unseen: &unseenDeletes{interval: cfg.DeletedUnpublishedCheck, log: log, metric: m.DeletedUnpublished.Add}}
	p.sup = outbox.NewSupervisor(outbox.SupervisorConfig{
		RestartBackoffMin:   cfg.RestartBackoffMin,
		RestartBackoffMax:   cfg.RestartBackoffMax,
		StandbyPollInterval: time.Second, // a poller is never a standby
		ShutdownTimeout:     cfg.ShutdownTimeout,
		Cause:               restartCause,
	}, log, m.Metrics)
	return p, nil
}

// State reports what the poller is doing (streaming: polling).
func (p *Poller) State() outbox.State { return p.sup.State() }

// Run polls until ctx is cancelled, then lets the batches in flight finish
// (at most Config.ShutdownTimeout) and returns nil. After a Kafka or
// PostgreSQL failure it rolls back, waits (capped exponential backoff) and
// starts a new session with a new producer. It returns an error only for
// what a restart cannot fix: a poison row without a dead-letter producer
// (wrapping kafka.ErrPoison), a table it cannot poll (ErrSchema) or a
// row it cannot read (ErrBadRow).
func (p *Poller) Run(ctx context.Context) error { return p.sup.Run(ctx, p.session) }

func restartCause(err error) string {
	switch {
	case errors.Is(err, kafka.ErrProduce), errors.Is(err, errProducerOpen):
		return "kafka"
	case errors.Is(err, outbox.ErrHook), errors.Is(err, errHookOpen):
		return "hook"
	default:
		return "postgres"
	}
}

var (
	errProducerOpen = errors.New("open producer")
	errHookOpen     = errors.New("open post-publish hook")
)

// session is one set of connections and one producer, until an error or
// ctx; hardCtx (the supervisor's shutdown watchdog) rolls back the batches
// in flight.
func (p *Poller) session(ctx, hardCtx context.Context) (progressed bool, err error) {
	var published atomic.Bool
	defer func() { progressed = published.Load() }()
	conns, err := p.connect(ctx)
	if err != nil {
		return false, err
	}
	defer closeConns(conns)
	tbl, err := inspect(ctx, conns[0], p.cfg)
	if err != nil {
		return false, err
	}
	if !tbl.hasIndex {
		p.log.Warn("no partial index on unpublished rows: every poll scans the outbox; run \"outboxd migrate --source=poll\" (blocks writes while it builds) or, on a large outbox, CREATE INDEX CONCURRENTLY ON "+tbl.name+" (id) WHERE published_at IS NULL",
			zap.String("table", tbl.plain))
	}

	prod, err := p.deps.NewProducer()
	if err != nil {
		return false, fmt.Errorf("%w: %w", errProducerOpen, err)
	}
	dlq, hooks, closeDeps, err := p.openDeps(ctx, len(conns))
	if err != nil {
		prod.Close()
		for range prod.Results() {
		}
		return false, err
	}
	defer closeDeps()
	return false, p.runWorkers(ctx, hardCtx, conns, tbl, prod, dlq, hooks, &published)
}

// connect opens one connection per worker.
func (p *Poller) connect(ctx context.Context) ([]*pgx.Conn, error) {
	conns := make([]*pgx.Conn, 0, p.cfg.Workers)
	for range p.cfg.Workers {
		c, err := pgx.ConnectConfig(ctx, p.pgcfg.Copy())
		if err != nil {
			closeConns(conns)
			return nil, fmt.Errorf("poll: connect to PostgreSQL: %w", err)
		}
		conns = append(conns, c)
	}
	return conns, nil
}

func closeConns(conns []*pgx.Conn) {
	for _, c := range conns {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.Close(cctx)
		cancel()
	}
}

// openDeps connects the dead-letterer and one hook per worker, when set.
// closeDeps closes them; on an error they are closed already.
func (p *Poller) openDeps(ctx context.Context, workers int) (dlq outbox.DeadLetterer, hooks []outbox.Hook, closeDeps func(), err error) {
	var closers outbox.Closers
	defer func() {
		if err != nil {
			closers.CloseAll()
		}
	}()
	if p.deps.NewDeadLetterer != nil {
		if dlq, err = p.deps.NewDeadLetterer(); err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %w", errProducerOpen, err)
		}
		closers.Add(dlq)
	}
	hooks = make([]outbox.Hook, workers)
	if p.deps.NewHook != nil {
		for i := range hooks {
			h, err := p.deps.NewHook(ctx)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%w: %w", errHookOpen, err)
			}
			closers.Add(h)
			hooks[i] = h
		}
	}
	return dlq, hooks, closers.CloseAll, nil
}

// runWorkers runs one worker per connection until a stop or the first
// failure (returned), then closes the producer and waits for its records.
func (p *Poller) runWorkers(ctx, hardCtx context.Context, conns []*pgx.Conn, tbl *table, prod outbox.Producer, dlq outbox.DeadLetterer, hooks []outbox.Hook, published *atomic.Bool) error {
	// readCtx stops new polls (a stop, or a worker failed); hardCtx
	// abandons the batches in flight.
	readCtx, cancelRead := context.WithCancel(ctx)
	defer cancelRead()
	hardCtx, cancelHard := context.WithCancel(hardCtx)
	defer cancelHard()

	p.sup.Running()
	p.log.Info("polling", zap.String("table", tbl.plain), zap.Strings("columns", tbl.columns),
		zap.Duration("interval", p.cfg.Interval), zap.Int("batch_size", p.cfg.BatchSize), zap.Int("workers", p.cfg.Workers))

	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for i, c := range conns {
		w := &worker{p: p, conn: c, tbl: tbl, prod: prod, dlq: dlq, hook: hooks[i],
			acks: make(chan *kafka.Record, p.cfg.BatchSize), published: published}
		if i == 0 {
			w.unseen = p.unseen
		}
		// Stagger the workers across the interval.
		first := time.Duration(i) * p.cfg.Interval / time.Duration(len(conns))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.run(readCtx, hardCtx, first); err != nil {
				errOnce.Do(func() {
					firstErr = err
					cancelRead()
					cancelHard()
				})
			}
		}()
	}
	wg.Wait()
	prod.Close()
	for range prod.Results() {
		// Every record of the session came back to its worker's acks (Done)
		// once Results is closed; nothing else arrives here.
	}
	return firstErr
}
