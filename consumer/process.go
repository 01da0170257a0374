package consumer

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
)

// processor takes one message at a time until it is done (process), or
// tries a batch of them once (processBatch).
type processor struct {
	cfg   Config
	store store
	dlq   Producer
	h     Handler      // for process
	bh    BatchHandler // for processBatch
	log   *zap.Logger
	stats *counters
	// sleep waits d or until ctx ends; replaced by the tests.
	sleep func(ctx context.Context, d time.Duration) error
}

// process handles m until it is done and reports how. parseErr is the
// error of reading its outbox id (a domain error), if any. The error is
// non-nil only when m is not done: ctx ended (err is ctx's), or the
// dead-letter publish failed (a *DeadLetterError).
func (p *processor) process(ctx context.Context, m *Message, parseErr error) (Result, error) {
	if parseErr != nil {
		return p.deadLetter(ctx, m, parseErr, ClassDomain, 1)
	}
	// The handler's context carries m's trace context (see TraceContextFrom).
	hctx := handlerContext(ctx, m)
	attempt, dbFailures := 0, 0
	for {
		attempt++
		m.Attempt = attempt
		dup, err := p.store.attempt(hctx, m, p.h)
		if err == nil {
			if dup {
				return Result{Outcome: Duplicate, Attempts: attempt}, nil
			}
			return Result{Outcome: Processed, Attempts: attempt}, nil
		}
		if ctx.Err() != nil {
			return Result{}, context.Cause(ctx)
		}

		var dbErr *dbError
		if errors.As(err, &dbErr) {
			// Not the message's fault: wait for the database.
			attempt--
			dbFailures++
			wait := p.cfg.backoff(dbFailures)
			p.log.Warn("database failure, retrying the message", zap.Stringer("message", m),
				zap.Int64("outbox_id", m.OutboxID), zap.Duration("backoff", wait), zap.Error(err))
			if err := p.sleep(ctx, wait); err != nil {
				return Result{}, err
			}
			continue
		}
		dbFailures = 0

		if IsDomain(err) {
			return p.deadLetter(ctx, m, err, ClassDomain, attempt)
		}
		if attempt > p.cfg.MaxRetries {
			if perr := p.store.ping(ctx); perr != nil {
				// The handler probably failed because the database is
				// down: wait for it and start over rather than dead-letter.
				p.log.Warn("retries exhausted but the database is unreachable: not dead-lettering, retrying once it answers",
					zap.Stringer("message", m), zap.Int64("outbox_id", m.OutboxID), zap.Error(err), zap.NamedError("ping", perr))
				attempt = 0
				if err := p.sleep(ctx, p.cfg.BackoffMax); err != nil {
					return Result{}, err
				}
				continue
			}
			return p.deadLetter(ctx, m, err, ClassTransient, attempt)
		}
		wait := p.cfg.backoff(attempt)
		p.stats.retries.Add(1)
		p.log.Info("transient failure, retrying", zap.Stringer("message", m), zap.Int64("outbox_id", m.OutboxID),
			zap.Int("attempt", attempt), zap.Duration("backoff", wait), zap.Error(err))
		if err := p.sleep(ctx, wait); err != nil {
			return Result{}, err
		}
	}
}

// deadLetter publishes m to its dead-letter topic and waits for the
// acknowledgement.
func (p *processor) deadLetter(ctx context.Context, m *Message, cause error, class string, attempts int) (Result, error) {
	topic := p.cfg.deadLetterTopic(m.Topic)
	rec := deadLetterRecord(topic, p.cfg.GroupID, m, cause, class, attempts)
	part, off, err := p.dlq.SendMessage(rec)
	if err != nil {
		return Result{}, &DeadLetterError{
			Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
			DeadLetterTopic: topic, Cause: cause, Err: err,
		}
	}
	p.log.Warn("message dead-lettered", zap.Stringer("message", m), zap.Int64("outbox_id", m.OutboxID),
		zap.String("class", class), zap.Int("attempts", attempts), zap.String("dead_letter_topic", topic),
		zap.Int32("dead_letter_partition", part), zap.Int64("dead_letter_offset", off), zap.Error(cause))
	return Result{
		Outcome: DeadLettered, Attempts: attempts, Err: cause, Class: class,
		DeadLetterTopic: topic, DeadLetterPartition: part, DeadLetterOffset: off,
	}, nil
}

// sleepCtx waits d or until ctx ends (then it returns ctx's cause).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if !backoff.Sleep(ctx, d) {
		return context.Cause(ctx)
	}
	return nil
}
