package publisher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Pipeline produces the events of one replication session and tracks what is
// safe to confirm: its Gate is what the stream asks. A Pipeline runs once.
type Pipeline struct {
	cfg  Config
	log  *zap.Logger
	prod outbox.Producer
	// batch is prod when it takes several records at once, else nil.
	batch batchSender
	dlq   outbox.DeadLetterer // nil: poison halts
	hook  outbox.Hook         // nil: none
	wm    *Watermark
	lim   *limiter
	m     *outbox.Metrics
	// mode is the delivery mode (plain until useCheckpoints).
	mode delivery
	// pending are records acquired and not yet handed to the producer
	// (flush); owned by Run's goroutine.
	pending []*kafka.Record

	done     chan struct{}
	failOnce sync.Once
	failErr  error
	failed   chan struct{}
	// progressed is set by the first acknowledged event.
	progressed atomic.Bool
	// cancel ends the session context that every blocking call of Run and
	// the ack loop waits on (the limiter, Send, the dead-letterer, hooks),
	// so the first failure releases them all.
	cancel context.CancelCauseFunc
	crash  func()
}

// NewPipeline builds a pipeline that starts at the slot's confirmed position.
// dlq and hook may be nil.
func NewPipeline(cfg Config, log *zap.Logger, prod outbox.Producer, dlq outbox.DeadLetterer, hook outbox.Hook, start pglogrepl.LSN, m *outbox.Metrics) *Pipeline {
	if m == nil {
		m = outbox.NewMetrics(nil)
	}
	wm := NewWatermark(start)
	m.Track(wm) // for the lag-seconds metric
	p := &Pipeline{
		cfg:    cfg,
		log:    log,
		prod:   prod,
		dlq:    dlq,
		hook:   hook,
		wm:     wm,
		lim:    newLimiter(cfg.MaxInFlightEvents, cfg.MaxInFlightBytes),
		m:      m,
		done:   make(chan struct{}),
		failed: make(chan struct{}),
		crash:  func() { os.Exit(3) },
	}
	p.batch, _ = prod.(batchSender)
	p.mode = plain{wm}
	m.TrackStall(p.lim) // for the stalled-seconds metric and readiness
	return p
}

// Progressed reports whether Kafka acknowledged (or the dead-letter topic
// took) at least one event of this pipeline.
func (p *Pipeline) Progressed() bool { return p.progressed.Load() }

// useCheckpoints turns checkpoints on before Run: the delivery mode becomes
// checkpointed, or transactional for exactly-once (which needs a
// Transactional producer).
func (p *Pipeline) useCheckpoints(cp *checkpointing) error {
	d, err := newDelivery(p, cp)
	if err != nil {
		return err
	}
	p.mode = d
	return nil
}

// Gate is what the stream asks what it may confirm: the watermark as far as
// the delivery mode lets it go. Take it after useCheckpoints.
func (p *Pipeline) Gate() replication.Gate { return gate{wm: p.wm, mode: p.mode, done: p.done} }

// Confirmed is the done prefix: every event up to it is acknowledged (and,
// in exactly-once mode, committed). The gate may hold the stream below it.
func (p *Pipeline) Confirmed() pglogrepl.LSN { return p.wm.Confirmed() }

// Done is closed when Run has returned.
func (p *Pipeline) Done() <-chan struct{} { return p.done }

// TryAcquire implements replication.Budget: the stream takes room for each
// event before it hands it over, from the same budget that bounds what is
// in flight to Kafka (--max-in-flight-bytes, --max-in-flight-events).
func (p *Pipeline) TryAcquire(n int64) bool { return p.lim.streamAcquire(n) }

// Freed implements replication.Budget.
func (p *Pipeline) Freed() <-chan struct{} { return p.lim.freed }

// fail records the session's first failure and releases every goroutine
// of the session that waits on the session context.
func (p *Pipeline) fail(err error) {
	p.failOnce.Do(func() {
		p.failErr = err
		close(p.failed)
		p.cancel(err)
	})
}

// errPipelineDone ends the session context when Run returns normally.
var errPipelineDone = errors.New("publisher: pipeline done")

// Run produces every event read from in. It returns nil once in is closed
// and every produced event is acknowledged; the first produce error or
// poison event (without a dead-letter topic) otherwise; ctx.Err() when ctx
// is cancelled first. It does not close the producer.
//
// Run and its ack loop wait on one session context derived from ctx. The
// first failure (a failed record, a hook or dead-letter error, a protocol
// error) cancels it, so a Run blocked on the in-flight limit or on a full
// producer input returns that failure at once instead of waiting for
// acknowledgements that will never come.
func (p *Pipeline) Run(ctx context.Context, in <-chan replication.Message) error {
	defer close(p.done)
	ctx, p.cancel = context.WithCancelCause(ctx)
	acksDone := make(chan struct{})
	defer func() {
		p.cancel(errPipelineDone)
		<-acksDone
	}()
	go func() {
		defer close(acksDone)
		p.ackLoop(ctx)
	}()
	err := p.run(ctx, in)
	select {
	case <-p.failed:
		return p.failErr // the first failure, not the cancellation it caused
	default:
		return err
	}
}

func (p *Pipeline) run(ctx context.Context, in <-chan replication.Message) error {
	var (
		st     readState
		tick   <-chan time.Time
		cpAcks = p.mode.checkpointAcks()
	)
	if d := p.mode.interval(); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		if len(p.pending) > 0 && p.lim.streamWaiting() {
			// The stream waits for room that only acknowledgements free:
			// what is held back must go now.
			if err := p.flush(ctx); err != nil {
				return err
			}
		}
		var m replication.Message
		var ok bool
		select {
		case m, ok = <-in:
		case <-p.lim.wanted:
			continue // see above
		case <-tick:
			if err := p.mode.tick(ctx); err != nil {
				return err
			}
			continue
		case r := <-cpAcks:
			if err := p.mode.checkpointAcked(r); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			return ctx.Err()
		}
		if !ok {
			if st.cur != nil {
				return p.cut(ctx, &st)
			}
			if err := p.drain(ctx); err != nil {
				return err
			}
			return p.mode.finish(ctx)
		}
		if err := p.handle(ctx, &st, &m, len(in) > 0); err != nil {
			return err
		}
	}
}

// errStreamCut: the stream ended inside a PostgreSQL transaction. The session
// ends with the stream's own error (see Service.stream).
var errStreamCut = errors.New("publisher: the replication stream ended inside a transaction")

// cut ends a session whose stream closed inside a PostgreSQL transaction. It
// is not a clean end: the transaction in hand is incomplete, so none of it
// may be confirmed or committed. The delivery mode keeps what is done of the
// transactions before it (at-least-once) or none of the open Kafka
// transaction, which holds part of the cut one (exactly-once: the session
// aborts it). After the restart PostgreSQL sends the whole transaction again.
func (p *Pipeline) cut(ctx context.Context, st *readState) error {
	if err := p.mode.cut(ctx); err != nil {
		return err
	}
	return fmt.Errorf("%w (xid %d, final LSN %s): none of it is confirmed; the session restarts and reads it again whole",
		errStreamCut, st.begin.Xid, st.begin.FinalLSN)
}

// readState is the reader's transaction in hand.
type readState struct {
	cur      *txn // nil between transactions
	begin    replication.Begin
	skipping bool // the transaction is in Kafka already
}

// handle takes one message of the stream; more says another one waits.
func (p *Pipeline) handle(ctx context.Context, st *readState, m *replication.Message, more bool) error {
	if st.cur == nil && (m.Kind == replication.KindEvent || m.Kind == replication.KindBad || m.Kind == replication.KindCommit) {
		what := map[replication.Kind]string{replication.KindEvent: "event", replication.KindBad: "bad event", replication.KindCommit: "commit"}[m.Kind]
		return fmt.Errorf("publisher: %w: %s outside a transaction", replication.ErrProtocol, what)
	}
	switch m.Kind {
	case replication.KindBegin:
		st.cur = p.wm.Begin(m.Begin.CommitTime)
		st.begin = m.Begin
		st.skipping = p.mode.skip(m.Begin)
	case replication.KindEvent, replication.KindBad:
		if st.skipping {
			if m.Budgeted > 0 {
				p.lim.releaseHandedOver(m.Budgeted)
			}
			return nil
		}
		if m.Kind == replication.KindBad {
			return p.badEvent(ctx, st.cur, st.begin, &m.Bad, m.Budgeted)
		}
		observeReceived(p.m, st.begin)
		if bad, ok := p.unpublishable(st.cur, m); ok {
			return p.badEvent(ctx, st.cur, st.begin, &bad, m.Budgeted)
		}
		bad, err := p.produce(ctx, st.cur, m)
		if bad != nil {
			return p.badEvent(ctx, st.cur, st.begin, bad, m.Budgeted)
		}
		return err
	case replication.KindRejected:
		p.rejected(st.begin, st.cur != nil, m.Rejected)
	case replication.KindCommit:
		if err := p.flush(ctx); err != nil {
			return err
		}
		p.wm.Commit(st.cur, m.Commit.EndLSN)
		st.cur = nil
		p.m.ReceivedLSN.Set(float64(m.Commit.EndLSN))
		return p.mode.committed(ctx, st.begin, m.Commit, more, st.skipping)
	}
	return nil
}

// maxPending bounds the records of one transaction held back to go to the
// producer together (see flush).
const maxPending = 512

// produce hands event m's record to the producer, or returns it as a bad
// event when the Encoder finds it unpublishable.
func (p *Pipeline) produce(ctx context.Context, t *txn, m *replication.Message) (*replication.BadEvent, error) {
	r := outbox.NewRecord(&m.Event, &p.cfg.Mapping, t.commitTime)
	if cp := p.cfg.CheckpointTopic; cp != "" && r.Topic == cp {
		// The checkpoint topic is outboxd's: a row routed there, keyed as a
		// checkpoint, would be read back as one and skip what it claims.
		bad := eventBad(m, fmt.Sprintf("routed to %q, the checkpoint topic, which holds only outboxd's checkpoints", cp))
		return &bad, nil
	}
	if bad, err := p.encode(ctx, r, m); bad != nil || err != nil {
		return bad, err
	}
	r.Meta = t
	p.mode.prepare(r)
	size := recordCost(r)
	if m.Budgeted > 0 {
		// The stream took room for the decoded event; the record holds it
		// from now on (the event is dropped).
		p.lim.resize(m.Budgeted, size)
	} else if !p.lim.tryAcquire(size) {
		// The in-flight limit is reached: what is held back must go out
		// before waiting, or nothing would ever come back to free room.
		if err := p.flush(ctx); err != nil {
			return nil, err
		}
		if err := p.lim.acquire(ctx, size); err != nil {
			return nil, err
		}
	}
	p.wm.Add(t)
	p.m.InFlightEvents.Inc()
	p.m.InFlightBytes.Add(float64(size))
	p.pending = append(p.pending, r)
	var rowID int64
	if !m.Event.IDIsLSN {
		rowID = m.Event.ID
	}
	p.mode.produced(r, rowID)
	if len(p.pending) >= maxPending {
		return nil, p.flush(ctx)
	}
	return nil, nil
}

// recordCost is what r holds of the budget until it comes back: its bytes
// and the fixed cost of an event (replication.EventOverhead).
func recordCost(r *kafka.Record) int64 {
	return int64(r.Size()) + replication.EventOverhead
}

// flush hands the held-back records to the producer. The records of a
// PostgreSQL transaction arrive together (pgoutput sends it at commit): the
// reader holds them back until the commit, every maxPending records, and
// before anything waits for acknowledgements, so they share a request. Sent
// as they arrive, one by one whenever the reader had caught up with the
// walsender, each took a produce request of its own: at 20,000 events/s in
// 100-row transactions that doubled outboxd's CPU per event, loaded the
// broker, and on a 2-core machine starved the walsender into p99 latencies
// of 0.4–0.9 s (8–42 ms once held back; bench/README.md).
func (p *Pipeline) flush(ctx context.Context) error {
	if len(p.pending) == 0 {
		return nil
	}
	rs := p.pending
	p.pending = nil
	if p.batch != nil {
		return p.batch.SendBatch(ctx, rs)
	}
	for _, r := range rs {
		if err := p.prod.Send(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// drain sends what is held back and waits until every produced event is
// acknowledged.
func (p *Pipeline) drain(ctx context.Context) error {
	if err := p.flush(ctx); err != nil {
		return err
	}
	for {
		if p.lim.produced() == 0 {
			// Events handed over and not read yet hold room too, but
			// wait for this drain: they are not counted.
			return nil
		}
		select {
		case <-p.lim.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Pipeline) ackLoop(ctx context.Context) {
	acked := 0
	for {
		select {
		case r, ok := <-p.prod.Results():
			if !ok {
				return
			}
			if err := p.handleResult(ctx, r); err != nil {
				p.fail(err)
				return
			}
			if r.Err == nil {
				acked++
				if p.cfg.CrashAfterProduce > 0 && acked >= p.cfg.CrashAfterProduce {
					p.log.Info("DEMO: crashing on purpose after produce, before confirming (--crash-after-produce)", zap.Int("acked", acked))
					p.crash()
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// handleResult accounts for one record back from Kafka.
func (p *Pipeline) handleResult(ctx context.Context, r *kafka.Record) error {
	t, ok := r.Meta.(*txn)
	if !ok {
		return fmt.Errorf("publisher: %w: the producer returned a record this pipeline did not send (outbox id %d, topic %q)", replication.ErrProtocol, r.OutboxID, r.Topic)
	}
	size := recordCost(r)
	if r.Err != nil {
		if !errors.Is(r.Err, kafka.ErrPoison) {
			p.m.ProduceErrors.WithLabelValues(r.Topic).Inc()
			return r.Err
		}
		if p.dlq == nil {
			p.m.ProduceErrors.WithLabelValues(r.Topic).Inc()
			return r.Err
		}
		if err := p.dlq.DeadLetter(ctx, r, r.Err); err != nil {
			return fmt.Errorf("publisher: divert outbox id %d to dead-letter topic %q: %w", r.OutboxID, p.cfg.DeadLetterTopic, err)
		}
		p.log.Warn("poison event diverted to the dead-letter topic",
			zap.Int64("outbox_id", r.OutboxID), zap.String("topic", r.Topic),
			zap.String("dead_letter_topic", p.cfg.DeadLetterTopic), zap.Error(r.Err))
		p.m.DeadLettered.WithLabelValues(r.Topic).Inc()
	} else {
		if p.hook != nil {
			if err := p.hook.AfterPublish(ctx, r); err != nil {
				return err
			}
		}
		p.m.Published.WithLabelValues(r.Topic).Inc()
		p.m.PublishedBytes.WithLabelValues(r.Topic).Add(float64(size - replication.EventOverhead))
		p.m.LastEventTimestamp.SetToCurrentTime()
		if !t.commitTime.IsZero() {
			p.m.ObserveLatency(t.commitTime)
		}
	}
	p.mode.acked(t)
	p.lim.release(size)
	if !p.progressed.Load() {
		p.progressed.Store(true)
	}
	p.m.InFlightEvents.Dec()
	p.m.InFlightBytes.Sub(float64(size))
	p.m.ConfirmedLSN.Set(float64(p.wm.Confirmed()))
	return nil
}
