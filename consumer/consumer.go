package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// Consumer consumes outbox events with deduplication, retries and a
// dead-letter topic. Make one with [New] or [NewBatch] and call
// [Consumer.Run].
type Consumer struct {
	cfg   Config
	store store
	h     Handler      // one message per transaction
	bh    BatchHandler // a batch of messages per transaction (Config.BatchSize > 1)
	log   *zap.Logger
	stats counters

	// Kafka clients; replaced by the tests.
	newGroup    func(sc *sarama.Config) (sarama.ConsumerGroup, error)
	newProducer func(sc *sarama.Config) (Producer, func() error, error)
}

// New checks cfg and returns a Consumer that runs h for every new event,
// inside a transaction begun on db. logger may be nil.
//
// With [Config.BatchSize] > 1 one transaction holds up to BatchSize messages
// of a partition and h.Handle is called for each new one in turn, in offset
// order, each with its own message's trace context (see [BatchHandler] for
// the guarantees). A handler that relies on having the transaction to itself
// (SET LOCAL, transaction-scoped advisory locks, catching a failed
// statement) should keep BatchSize 1 or use [NewBatch].
func New(cfg Config, db DB, h Handler, logger *zap.Logger) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || h == nil {
		return nil, errors.New("consumer: New needs a DB and a Handler")
	}
	return newConsumer(cfg, db, h, perMessage{h}, logger)
}

// NewBatch checks cfg and returns a Consumer that runs h for the new events
// of up to [Config.BatchSize] messages of one partition at a time, inside one
// transaction begun on db; with BatchSize 1 (the default) every call gets a
// single message. A batch that fails is redone one message at a time, each
// call getting a one-element slice. logger may be nil.
func NewBatch(cfg Config, db DB, h BatchHandler, logger *zap.Logger) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if db == nil || h == nil {
		return nil, errors.New("consumer: NewBatch needs a DB and a BatchHandler")
	}
	return newConsumer(cfg, db, batchOfOne{h}, h, logger)
}

// newConsumer makes the Consumer of a checked cfg: h is the single-message
// path, bh the batch path.
func newConsumer(cfg Config, db DB, h Handler, bh BatchHandler, logger *zap.Logger) (*Consumer, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	st, err := newPGStore(db, cfg.DedupTable)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c := &Consumer{cfg: cfg, store: st, h: h, bh: bh, log: logger}
	c.newGroup = func(sc *sarama.Config) (sarama.ConsumerGroup, error) {
		return sarama.NewConsumerGroup(cfg.Brokers, cfg.GroupID, sc)
	}
	c.newProducer = func(sc *sarama.Config) (Producer, func() error, error) {
		p, err := sarama.NewSyncProducer(cfg.Brokers, sc)
		if err != nil {
			return nil, nil, err
		}
		return p, p.Close, nil
	}
	return c, nil
}

// Run joins the group and processes messages until ctx ends (it returns
// nil then) or a message cannot be done because its dead-letter publish
// failed (it returns the *DeadLetterError, after committing the offsets of
// the messages done before it). Errors of the group itself (a broker away, a
// rebalance) are logged and Run rejoins with backoff. Run may be called again
// after it returned.
func (c *Consumer) Run(ctx context.Context) error {
	sc, err := c.cfg.saramaConfig()
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	if sc.Consumer.Offsets.AutoCommit.Enable {
		return errors.New("consumer: Config.Sarama turned auto-commit on; offsets must be committed only after a message is done")
	}
	dlq, closeDLQ, err := c.newProducer(sc)
	if err != nil {
		return fmt.Errorf("consumer: dead-letter producer: %w", err)
	}
	defer func() {
		if err := closeDLQ(); err != nil {
			c.log.Warn("close dead-letter producer", zap.Error(err))
		}
	}()
	group, err := c.newGroup(sc)
	if err != nil {
		return fmt.Errorf("consumer: join group %q: %w", c.cfg.GroupID, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait() // the error logger ends when the group is closed
	defer func() {
		if err := group.Close(); err != nil {
			c.log.Warn("close consumer group", zap.Error(err))
		}
	}()
	wg.Go(func() {
		for err := range group.Errors() {
			c.log.Warn("consumer group", zap.Error(err))
		}
	})

	h := &groupHandler{
		cfg: c.cfg,
		log: c.log,
		proc: &processor{
			cfg: c.cfg, store: c.store, dlq: dlq, h: c.h, bh: c.bh, log: c.log, stats: &c.stats, sleep: sleepCtx,
		},
	}
	c.log.Info("consuming", zap.String("group", c.cfg.GroupID), zap.Strings("topics", c.cfg.Topics))
	failures := 0
	for {
		err := group.Consume(ctx, c.cfg.Topics, h)
		if fatal := h.fatalErr(); fatal != nil {
			return fatal
		}
		if ctx.Err() != nil {
			c.log.Info("stopped", zap.String("group", c.cfg.GroupID))
			return nil
		}
		if err == nil {
			failures = 0 // a rebalance ended the session: rejoin
			continue
		}
		if errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return fmt.Errorf("consumer: %w", err)
		}
		failures++
		wait := c.cfg.backoff(failures)
		c.log.Warn("consumer group session failed, rejoining", zap.Duration("backoff", wait), zap.Error(err))
		if sleepCtx(ctx, wait) != nil {
			return nil
		}
	}
}

// Stats are counts since the Consumer was made.
type Stats struct {
	Done         int64 // messages done: Processed + Duplicates + DeadLettered
	Processed    int64 // handler transactions committed
	Duplicates   int64 // skipped as already processed
	DeadLettered int64 // acknowledged by the dead-letter topic
	Retries      int64 // transient failures retried
	InFlight     int64 // messages being processed now

	// With Config.BatchSize > 1:
	Batches        int64 // transactions of several messages committed
	BatchFallbacks int64 // batches rolled back and redone one message at a time
}

// Stats returns the current counts.
func (c *Consumer) Stats() Stats {
	return c.stats.snapshot()
}

type counters struct {
	processed, duplicates, deadLettered, retries, inFlight atomic.Int64
	batches, batchFallbacks                                atomic.Int64
}

func (s *counters) count(o Outcome) {
	switch o {
	case Processed:
		s.processed.Add(1)
	case Duplicate:
		s.duplicates.Add(1)
	case DeadLettered:
		s.deadLettered.Add(1)
	}
}

func (s *counters) snapshot() Stats {
	st := Stats{
		Processed:    s.processed.Load(),
		Duplicates:   s.duplicates.Load(),
		DeadLettered: s.deadLettered.Load(),
		Retries:      s.retries.Load(),
		InFlight:     s.inFlight.Load(),

		Batches:        s.batches.Load(),
		BatchFallbacks: s.batchFallbacks.Load(),
	}
	st.Done = st.Processed + st.Duplicates + st.DeadLettered
	return st
}
