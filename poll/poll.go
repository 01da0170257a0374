package poll

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"go.uber.org/zap"
	"io"
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
	var closers []io.Closer
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i].Close()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	if p.deps.NewDeadLetterer != nil {
		if dlq, err = p.deps.NewDeadLetterer(); err != nil {
			return nil, nil, nil, fmt.Errorf("%w: %w", errProducerOpen, err)
		}
		if c, ok := dlq.(io.Closer); ok {
			closers = append(closers, c)
		}
	}
	hooks = make([]outbox.Hook, workers)
	if p.deps.NewHook != nil {
		for i := range hooks {
			h, err := p.deps.NewHook(ctx)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("%w: %w", errHookOpen, err)
			}
			if c, ok := h.(io.Closer); ok {
				closers = append(closers, c)
			}
			hooks[i] = h
		}
	}
	return dlq, hooks, closeAll, nil
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

// worker owns one connection and runs one polling transaction at a time.
type worker struct {
	p    *Poller
	conn *pgx.Conn
	tbl  *table
	prod outbox.Producer
	dlq  outbox.DeadLetterer
	hook outbox.Hook // nil: none
	// acks receives the worker's records back from the producer
	// (kafka.Record.Done): it holds BatchSize, so the producer never blocks.
	acks chan *kafka.Record
	// published is set once a batch of the session was published.
	published *atomic.Bool
	// unseen, on one worker of a session, notices rows deleted unpublished.
	unseen *unseenDeletes

	events []outbox.Event
	ids    []int64
}

func (w *worker) run(readCtx, hardCtx context.Context, first time.Duration) error {
	if !backoff.Sleep(readCtx, first) {
		return nil
	}
	for readCtx.Err() == nil {
		start := time.Now()
		n, err := w.batch(hardCtx)
		if err != nil {
			if readCtx.Err() != nil && hardCtx.Err() != nil {
				return nil // shutdown timeout: rolled back, not an error
			}
			return err
		}
		if n > 0 {
			w.published.Store(true)
		}
		w.unseen.check(readCtx, w.conn, w.tbl)
		if n == w.p.cfg.BatchSize {
			continue // a backlog: poll again at once
		}
		if !backoff.Sleep(readCtx, time.Until(start.Add(w.p.cfg.Interval))) {
			return nil
		}
	}
	return nil
}

// batch runs one polling transaction and returns the number of rows it
// published.
func (w *worker) batch(ctx context.Context) (n int, err error) {
	p := w.p
	began := time.Now()
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("poll: begin: %w", err)
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if err := w.read(ctx, tx); err != nil {
		return 0, err
	}
	if len(w.events) == 0 {
		p.m.Polls.WithLabelValues("empty").Inc()
		if err := tx.Commit(ctx); err != nil {
			return 0, fmt.Errorf("poll: commit: %w", err)
		}
		return 0, nil
	}

	if err := w.publish(ctx); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, w.tbl.updateSQL, w.ids); err != nil {
		return 0, fmt.Errorf("poll: mark published: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("poll: commit: %w", err)
	}
	n = len(w.events)
	outcome := "partial"
	if n == p.cfg.BatchSize {
		outcome = "full"
	}
	p.m.Polls.WithLabelValues(outcome).Inc()
	p.m.BatchSeconds.Observe(time.Since(began).Seconds())
	return n, nil
}

// publish produces the batch read (w.events) and waits until every record
// came back; the first failure is returned once all did (a shutdown timeout
// returns at once).
func (w *worker) publish(ctx context.Context) error {
	p := w.p
	now := time.Now()
	var (
		sent     int   // records handed to the producer or to acks
		outBytes int64 // bytes of those not back yet
		failed   error
	)
	p.m.InFlightEvents.Add(float64(len(w.events)))
	defer func() { // what never came back (a failure, a shutdown timeout)
		p.m.InFlightEvents.Sub(float64(sent))
		p.m.InFlightBytes.Sub(float64(outBytes))
	}()
	for i := range w.events {
		r := outbox.NewRecord(&w.events[i], &p.cfg.Mapping, now)
		var bad error // why the record is poison
		if r.Topic == "" {
			bad = errNoTopic
		} else if err := p.encode(ctx, r); errors.Is(err, kafka.ErrPoison) {
			bad = err // a payload that does not fit its schema
		} else if err != nil {
			failed = fmt.Errorf("poll: %w", err) // the registry: the batch rolls back, the session restarts
			break
		}
		size := int64(r.Size())
		if bad != nil {
			r.Err = &kafka.PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Size: int(size), Err: bad}
			w.acks <- r
		} else {
			r.Done = w.acks
			if err := w.prod.Send(ctx, r); err != nil {
				failed = fmt.Errorf("poll: produce: %w", err)
				break
			}
		}
		sent++
		outBytes += size
		p.m.InFlightBytes.Add(float64(size))
	}
	p.m.InFlightEvents.Sub(float64(len(w.events) - sent))
	// Wait for every record sent, even after a failure, so the producer
	// holds nothing of this batch when the session ends.
	for sent > 0 {
		var r *kafka.Record
		select {
		case r = <-w.acks:
		case <-ctx.Done():
			return ctx.Err()
		}
		size := int64(r.Size())
		sent--
		outBytes -= size
		p.m.InFlightEvents.Dec()
		p.m.InFlightBytes.Sub(float64(size))
		if failed != nil {
			continue // the batch rolls back: no hook, no dead letter
		}
		failed = w.result(ctx, r, int(size))
	}
	return failed
}

var errNoTopic = errors.New("the row has no topic and no --default-topic is set")

// Encoder writes a record in a wire format before it is produced
// (format.Encoder); an error matching kafka.ErrPoison makes the record
// poison (dead-lettered or halting), any other restarts the session.
type Encoder interface {
	Encode(ctx context.Context, r *kafka.Record) error
}

func (p *Poller) encode(ctx context.Context, r *kafka.Record) error {
	if p.cfg.Encoder == nil {
		return nil
	}
	return p.cfg.Encoder.Encode(ctx, r)
}

// result accounts for one record back from Kafka; poison goes to the
// dead-letter producer when there is one.
func (w *worker) result(ctx context.Context, r *kafka.Record, size int) error {
	p := w.p
	if r.Err == nil {
		if w.hook != nil {
			if err := w.hook.AfterPublish(ctx, r); err != nil {
				return err
			}
		}
		p.m.Published.WithLabelValues(r.Topic).Inc()
		p.m.PublishedBytes.WithLabelValues(r.Topic).Add(float64(size))
		if !r.Timestamp.IsZero() {
			p.m.CommitToAck.Observe(time.Since(r.Timestamp).Seconds())
		}
		return nil
	}
	if !errors.Is(r.Err, kafka.ErrPoison) || w.dlq == nil {
		p.m.ProduceErrors.WithLabelValues(r.Topic).Inc()
		return r.Err
	}
	if err := w.dlq.DeadLetter(ctx, r, r.Err); err != nil {
		return fmt.Errorf("poll: divert outbox id %d to dead-letter topic %q: %w", r.OutboxID, p.cfg.DeadLetterTopic, err)
	}
	p.log.Warn("poison event diverted to the dead-letter topic",
		zap.Int64("outbox_id", r.OutboxID), zap.String("topic", r.Topic),
		zap.String("dead_letter_topic", p.cfg.DeadLetterTopic), zap.Error(r.Err))
	p.m.DeadLettered.WithLabelValues(r.Topic).Inc()
	return nil
}

// read selects and locks the next batch into w.events and w.ids.
func (w *worker) read(ctx context.Context, tx pgx.Tx) error {
	w.events = w.events[:0]
	w.ids = w.ids[:0]
	rows, err := tx.Query(ctx, w.tbl.selectSQL, w.p.cfg.BatchSize)
	if err != nil {
		return fmt.Errorf("poll: select: %w", err)
	}
	if w.events, err = scanEvents(rows, w.tbl, w.events); err != nil {
		return err
	}
	for _, ev := range w.events {
		w.ids = append(w.ids, ev.ID)
	}
	return nil
}

// scanEvents reads the rows of a query of table.columnsSQL as events, as
// the pgoutput decoder would see them, and closes rows.
func scanEvents(rows pgx.Rows, tbl *table, events []outbox.Event) ([]outbox.Event, error) {
	defer rows.Close()
	var (
		id                    int64
		agg, topic, eventType pgtype.Text
		payload               []byte
		created               pgtype.Timestamptz
	)
	for rows.Next() {
		payload = nil
		if err := rows.Scan(&id, &agg, &payload, &topic, &created, &eventType); err != nil {
			return events, halt(ErrBadRow, "outbox table %s: read a row: %v", tbl.plain, err)
		}
		if !agg.Valid || payload == nil {
			col := "aggregate_id"
			if agg.Valid {
				col = "payload"
			}
			return events, halt(ErrBadRow, "outbox row id=%d: column %q is NULL", id, col)
		}
		ev := outbox.Event{ID: id, AggregateID: agg.String, Payload: payload,
			Topic: topic.String, EventType: eventType.String}
		if created.Valid {
			if created.InfinityModifier != pgtype.Finite {
				return events, halt(ErrBadRow, "outbox row id=%d: column \"created_at\" is infinite", id)
			}
			ev.CreatedAt = created.Time
		}
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return events, fmt.Errorf("poll: select: %w", err)
	}
	return events, nil
}
