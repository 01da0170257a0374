package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// groupHandler is the sarama.ConsumerGroupHandler: one ConsumeClaim per
// partition, each on its own goroutine (sarama starts one per claim), each
// processing its messages in offset order, one at a time or a batch at a
// time.
type groupHandler struct {
	cfg  Config
	proc *processor
	log  *zap.Logger

	mu    sync.Mutex
	fatal error // the first *DeadLetterError; ends Run
}

func (g *groupHandler) Setup(sess sarama.ConsumerGroupSession) error {
	g.log.Info("partitions assigned", zap.Any("claims", sess.Claims()),
		zap.String("member", sess.MemberID()), zap.Int32("generation", sess.GenerationID()))
	return nil
}

// Cleanup commits what was marked and not committed yet, before the
// partitions move to another member.
func (g *groupHandler) Cleanup(sess sarama.ConsumerGroupSession) error {
	sess.Commit()
	return nil
}

// ConsumeClaim processes the partition's messages in order: up to BatchSize
// of them at a time (see collect), in one transaction when there are
// several. A message's offset is marked only once it is done, and never
// before the messages ahead of it are; marks are committed every
// CommitInterval (or at once when it is 0) and when the claim ends. When a
// message cannot be done (dead-letter publish failed), the claim stops
// without marking it or anything after it, and the session ends: Run returns
// the error.
func (g *groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	var tick <-chan time.Time
	if g.cfg.CommitInterval > 0 {
		t := time.NewTicker(g.cfg.CommitInterval)
		defer t.Stop()
		tick = t.C
	}
	c := &claimRun{g: g, sess: sess}
	defer func() {
		if c.dirty {
			sess.Commit()
		}
	}()
	msgs := claim.Messages()
	for {
		select {
		case cm, ok := <-msgs:
			if !ok {
				return nil
			}
			batch, open := g.collect(ctx, msgs, cm)
			if goOn, err := c.consume(ctx, batch); !goOn {
				return err
			}
			if !open {
				return nil
			}
		case <-tick:
			if c.dirty {
				sess.Commit()
				c.dirty = false
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// collect returns first and the messages that follow it on msgs, up to
// BatchSize in all and until their bytes reach BatchMaxBytes: those already
// buffered, and with BatchWait > 0 those arriving within BatchWait. open is
// false when msgs was closed.
func (g *groupHandler) collect(ctx context.Context, msgs <-chan *sarama.ConsumerMessage, first *sarama.ConsumerMessage) (batch []*sarama.ConsumerMessage, open bool) {
	n := g.cfg.batchSize()
	batch = []*sarama.ConsumerMessage{first}
	if n == 1 {
		return batch, true
	}
	var deadline <-chan time.Time
	if g.cfg.BatchWait > 0 {
		t := time.NewTimer(g.cfg.BatchWait)
		defer t.Stop()
		deadline = t.C
	}
	bytes, maxBytes := messageBytes(first), g.cfg.batchMaxBytes()
	for len(batch) < n && bytes < maxBytes {
		if deadline == nil {
			select {
			case cm, ok := <-msgs:
				if !ok {
					return batch, false
				}
				batch = append(batch, cm)
				bytes += messageBytes(cm)
			default:
				return batch, true // nothing more buffered: no waiting
			}
			continue
		}
		select {
		case cm, ok := <-msgs:
			if !ok {
				return batch, false
			}
			batch = append(batch, cm)
			bytes += messageBytes(cm)
		case <-deadline:
			return batch, true
		case <-ctx.Done():
			return batch, true // processing it fails and marks nothing
		}
	}
	return batch, true
}

// claimRun is the state of one ConsumeClaim.
type claimRun struct {
	g     *groupHandler
	sess  sarama.ConsumerGroupSession
	dirty bool // marked since the last commit
}

// pending is a message of a batch with a valid outbox id.
type pending struct {
	cm *sarama.ConsumerMessage
	m  *Message
}

// consume processes cms, in order, until each is done: the runs of messages
// with a valid outbox id as batches, the others alone (they are dead-lettered).
// ok is false when the claim must stop: err is nil when ctx ended, else the
// *DeadLetterError of a message that could not be done.
func (c *claimRun) consume(ctx context.Context, cms []*sarama.ConsumerMessage) (ok bool, err error) {
	var run []pending
	for _, cm := range cms {
		m, parseErr := newMessage(cm)
		if parseErr == nil {
			run = append(run, pending{cm, m})
			continue
		}
		if ok, err := c.batch(ctx, run); !ok {
			return false, err
		}
		run = nil
		if ok, err := c.one(ctx, cm, m, parseErr); !ok {
			return false, err
		}
	}
	return c.batch(ctx, run)
}

// batch processes run in one transaction, or, when that fails, one message
// at a time. A lone message goes straight to the one-at-a-time path.
func (c *claimRun) batch(ctx context.Context, run []pending) (ok bool, err error) {
	switch len(run) {
	case 0:
		return true, nil
	case 1:
		return c.one(ctx, run[0].cm, run[0].m, nil)
	}
	proc := c.g.proc
	ms := make([]*Message, len(run))
	for i, p := range run {
		ms[i] = p.m
	}
	proc.stats.inFlight.Add(int64(len(ms)))
	res, err := proc.processBatch(ctx, ms)
	proc.stats.inFlight.Add(-int64(len(ms)))
	if err == nil {
		proc.stats.batches.Add(1)
		for i, p := range run {
			c.done(p.cm, p.m, res[i])
		}
		c.flush()
		return true, nil
	}
	if ctx.Err() != nil {
		return false, nil // stopping: not done, not marked, delivered again
	}
	// Nothing of the batch happened. Redo it one message at a time, so that
	// a failing message is retried or dead-lettered alone.
	proc.stats.batchFallbacks.Add(1)
	c.g.log.Warn("batch failed, processing its messages one at a time",
		zap.Stringer("first", ms[0]), zap.Int64("last_offset", ms[len(ms)-1].Offset),
		zap.Int("messages", len(ms)), zap.Error(err))
	for _, p := range run {
		m, parseErr := newMessage(p.cm) // afresh: the handler may have changed the first copy
		if ok, err := c.one(ctx, p.cm, m, parseErr); !ok {
			return false, err
		}
	}
	return true, nil
}

// one processes a message alone until it is done.
func (c *claimRun) one(ctx context.Context, cm *sarama.ConsumerMessage, m *Message, parseErr error) (ok bool, err error) {
	proc := c.g.proc
	proc.stats.inFlight.Add(1)
	res, err := proc.process(ctx, m, parseErr)
	proc.stats.inFlight.Add(-1)
	if err != nil {
		if ctx.Err() != nil {
			return false, nil // stopping: not done, not marked, delivered again
		}
		c.g.setFatal(err)
		c.g.log.Error("message not done, stopping", zap.Stringer("message", m), zap.Error(err))
		return false, err
	}
	c.done(cm, m, res)
	c.flush()
	return true, nil
}

// done counts a message that is done, reports it to OnDone and marks its
// offset.
func (c *claimRun) done(cm *sarama.ConsumerMessage, m *Message, res Result) {
	c.g.proc.stats.count(res.Outcome)
	if c.g.cfg.OnDone != nil {
		c.g.cfg.OnDone(m, res)
	}
	c.sess.MarkMessage(cm, "")
	c.dirty = true
}

// flush commits the marks at once when CommitInterval is 0.
func (c *claimRun) flush() {
	if c.g.cfg.CommitInterval == 0 && c.dirty {
		c.sess.Commit()
		c.dirty = false
	}
}

func (g *groupHandler) setFatal(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fatal == nil {
		g.fatal = err
	}
}

func (g *groupHandler) fatalErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fatal
}
