package consumer

import (
	"sync"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// groupHandler is the sarama.ConsumerGroupHandler: one ConsumeClaim per
// partition, each processing its messages one at a time.
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

// ConsumeClaim processes the partition's messages in order. A message's
// offset is marked only once it is done; marks are committed every
// CommitInterval (or at once when it is 0) and when the claim ends. When a
// message cannot be done (dead-letter publish failed), the claim stops
// without marking it and the session ends: Run returns the error.
func (g *groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	var tick <-chan time.Time
	if g.cfg.CommitInterval > 0 {
		t := time.NewTicker(g.cfg.CommitInterval)
		defer t.Stop()
		tick = t.C
	}
	dirty := false // marked since the last commit
	defer func() {
		if dirty {
			sess.Commit()
		}
	}()
	for {
		select {
		case cm, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			m, parseErr := newMessage(cm)
			g.proc.stats.inFlight.Add(1)
			res, err := g.proc.process(ctx, m, parseErr)
			g.proc.stats.inFlight.Add(-1)
			if err != nil {
				if ctx.Err() != nil {
					return nil // stopping: not done, not marked, delivered again
				}
				g.setFatal(err)
				g.log.Error("message not done, stopping", zap.Stringer("message", m), zap.Error(err))
				return err
			}
			g.proc.stats.count(res.Outcome)
			if g.cfg.OnDone != nil {
				g.cfg.OnDone(m, res)
			}
			sess.MarkMessage(cm, "")
			if g.cfg.CommitInterval == 0 {
				sess.Commit()
			} else {
				dirty = true
			}
		case <-tick:
			if dirty {
				sess.Commit()
				dirty = false
			}
		case <-ctx.Done():
			return nil
		}
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
