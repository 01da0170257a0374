package publisher

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Delivery modes.
const (
	AtLeastOnce = "at-least-once"
	ExactlyOnce = "exactly-once"
)

// committer is the transactional side of a producer (kafka.Producer with a
// transactional id).
type committer interface {
	Commit(ctx context.Context) error
}

// checkpointing is a pipeline's checkpoint state. The stream asks to
// confirm positions (Checkpointed); what it may confirm is what the
// checkpoint topic holds. Owned by the pipeline's reader goroutine, except
// the atomics.
type checkpointing struct {
	topic string
	id    Identity
	// skipBelow: transactions whose commit record starts before it are
	// already in Kafka (the checkpoint says so): skipped, not re-published.
	skipBelow pglogrepl.LSN
	skipped   int
	// generation and maxID go into every checkpoint record: the history
	// generation and the highest integer outbox id produced (or carried
	// from the checkpoint read at start). origin is the origin header.
	generation int
	maxID      atomic.Int64
	origin     []byte
	// lastCommit is the commit time (unix ns) of the last transaction with
	// events read, for checkpoints that name no transaction of their own.
	lastCommit atomic.Int64

	want    atomic.Uint64 // the highest position the stream wanted to confirm
	covered atomic.Uint64 // the highest position the checkpoint topic holds

	acks     chan *kafka.Record // the checkpoint records back (Record.Done)
	inFlight bool               // at-least-once: a checkpoint record is out
	pending  pglogrepl.LSN      // its position

	// Exactly-once: the open Kafka transaction.
	open   bool
	events int
	since  time.Time
	last   Checkpoint // the last Postgres transaction in it
	heldMu sync.Mutex
	held   []*txn // events acknowledged, waiting for the commit
}

func newCheckpointing(topic string, id Identity, cp *Checkpoint, start pglogrepl.LSN) *checkpointing {
	c := &checkpointing{topic: topic, id: id, acks: make(chan *kafka.Record, 1)}
	covered := start
	if cp != nil {
		c.skipBelow = cp.EndLSN
		covered = max(covered, cp.EndLSN)
		c.generation = cp.Generation
		c.maxID.Store(cp.MaxOutboxID)
		if !cp.CommitTime.IsZero() {
			c.lastCommit.Store(cp.CommitTime.UnixNano())
		}
	}
	c.origin = []byte(id.Origin(c.generation))
	c.covered.Store(uint64(covered))
	return c
}

// stamp adds what every checkpoint record carries forward.
func (c *checkpointing) stamp(cp Checkpoint) Checkpoint {
	cp.Generation, cp.MaxOutboxID = c.generation, c.maxID.Load()
	if cp.CommitTime.IsZero() {
		if ns := c.lastCommit.Load(); ns != 0 {
			cp.CommitTime = time.Unix(0, ns).UTC()
		}
	}
	return cp
}

// noteRecord adds the origin header to an event's record and remembers its
// id for MaxOutboxID.
func (c *checkpointing) noteRecord(r *kafka.Record) {
	c.addOrigin(r)
	if r.OutboxID > c.maxID.Load() {
		c.maxID.Store(r.OutboxID)
	}
}

// addOrigin adds the origin header, when this shape sends it.
func (c *checkpointing) addOrigin(r *kafka.Record) {
	if c.origin != nil {
		r.Headers = append(r.Headers, kafka.Header{Key: outbox.HeaderOrigin, Value: c.origin})
	}
}

// Checkpointed implements replication.Checkpointer: the stream may confirm
// want only as far as the checkpoint topic holds it.
func (p *Pipeline) Checkpointed(want pglogrepl.LSN) pglogrepl.LSN {
	c := p.cp
	if c == nil {
		return want
	}
	for {
		old := c.want.Load()
		if uint64(want) <= old || c.want.CompareAndSwap(old, uint64(want)) {
			break
		}
	}
	return min(want, pglogrepl.LSN(c.covered.Load()))
}

func (p *Pipeline) eos() bool { return p.cfg.Delivery == ExactlyOnce }

// skip reports whether a transaction beginning with b is already in Kafka.
func (p *Pipeline) skip(b replication.Begin) bool {
	if p.cp == nil || b.FinalLSN >= p.cp.skipBelow {
		return false
	}
	p.cp.skipped++
	if p.cp.skipped == 1 {
		p.log.Info("skipping transactions the checkpoint says are in Kafka already",
			zap.Stringer("checkpoint", p.cp.skipBelow))
	}
	return true
}

// acked is the success path of a record for the watermark: at once, or in
// exactly-once mode at the commit of its Kafka transaction.
func (p *Pipeline) acked(t *txn) {
	if p.cp != nil && p.eos() {
		p.cp.heldMu.Lock()
		p.cp.held = append(p.cp.held, t)
		p.cp.heldMu.Unlock()
		return
	}
	p.wm.Ack(t)
}

// produced notes an event produced in exactly-once mode: it opens the Kafka
// transaction.
func (p *Pipeline) produced() {
	if p.cp == nil || !p.eos() {
		return
	}
	if !p.cp.open {
		p.cp.open, p.cp.since = true, time.Now()
	}
	p.cp.events++
}

// committed is called after a Postgres transaction's Commit was read. In
// exactly-once mode it closes the Kafka transaction when it is big or old
// enough, or when nothing else is waiting (low latency when quiet).
func (p *Pipeline) committed(ctx context.Context, b replication.Begin, c replication.Commit, more bool) error {
	if p.cp != nil && !c.CommitTime.IsZero() {
		p.cp.lastCommit.Store(c.CommitTime.UnixNano())
	}
	if p.cp == nil || !p.eos() || !p.cp.open {
		return nil
	}
	p.cp.last = Checkpoint{EndLSN: c.EndLSN, CommitLSN: c.CommitLSN, Xid: b.Xid, CommitTime: c.CommitTime}
	if more && p.cp.events < p.cfg.TxnMaxEvents && time.Since(p.cp.since) < p.cfg.TxnMaxAge {
		return nil
	}
	return p.commitKafkaTxn(ctx)
}

// commitKafkaTxn waits for every record of the Kafka transaction, adds the
// checkpoint of its last Postgres transaction, commits, and only then lets
// the watermark (and so the slot) move past them.
func (p *Pipeline) commitKafkaTxn(ctx context.Context) error {
	// The checkpoint goes out at once, beside the records still in flight:
	// the commit makes them visible together, so their order does not matter
	// and the round trips overlap.
	cp, err := p.sendCheckpoint(ctx, p.cp.last)
	if err != nil {
		return err
	}
	if err := p.drain(ctx); err != nil {
		return err
	}
	if err := p.checkpointWritten(ctx, cp); err != nil {
		return err
	}
	if err := p.prod.(committer).Commit(ctx); err != nil {
		return fmt.Errorf("publisher: commit the Kafka transaction of %d events up to %s: %w", p.cp.events, p.cp.last.EndLSN, err)
	}
	p.cp.covered.Store(uint64(p.cp.last.EndLSN))
	p.cp.heldMu.Lock()
	held := p.cp.held
	p.cp.held = nil
	p.cp.heldMu.Unlock()
	for _, t := range held {
		p.wm.Ack(t)
	}
	p.m.ConfirmedLSN.Set(float64(p.wm.Confirmed()))
	p.cp.open, p.cp.events = false, 0
	return nil
}

// writeCheckpoint sends a checkpoint record and waits for its
// acknowledgement.
func (p *Pipeline) writeCheckpoint(ctx context.Context, cp Checkpoint) error {
	if _, err := p.sendCheckpoint(ctx, cp); err != nil {
		return err
	}
	return p.checkpointWritten(ctx, cp)
}

// sendCheckpoint sends a checkpoint record; its acknowledgement comes back on
// the checkpoint channel (checkpointWritten).
func (p *Pipeline) sendCheckpoint(ctx context.Context, cp Checkpoint) (Checkpoint, error) {
	r, err := checkpointRecord(p.cp.topic, p.cp.id, p.cp.stamp(cp))
	if err != nil {
		return cp, err
	}
	r.Done = p.cp.acks
	return cp, p.prod.Send(ctx, r)
}

// checkpointWritten waits for the acknowledgement of the checkpoint sent.
func (p *Pipeline) checkpointWritten(ctx context.Context, cp Checkpoint) error {
	select {
	case r := <-p.cp.acks:
		if r.Err != nil {
			return fmt.Errorf("publisher: write checkpoint %s to %q: %w", cp.EndLSN, p.cp.topic, r.Err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tick moves the checkpoint to what the stream wants to confirm when the
// pipeline has nothing else to commit (an idle outbox, transactions of
// other tables, skipped ones). In at-least-once mode it also completes the
// checkpoint record in flight.
func (p *Pipeline) tick(ctx context.Context) error {
	c := p.cp
	want := pglogrepl.LSN(c.want.Load())
	if want <= pglogrepl.LSN(c.covered.Load()) {
		return nil
	}
	if p.eos() {
		if c.open {
			return nil // the next commit covers it
		}
		if err := p.writeCheckpoint(ctx, Checkpoint{EndLSN: want}); err != nil {
			return err
		}
		if err := p.prod.(committer).Commit(ctx); err != nil {
			return fmt.Errorf("publisher: commit the checkpoint %s: %w", want, err)
		}
		c.covered.Store(uint64(want))
		return nil
	}
	if c.inFlight {
		return nil
	}
	r, err := checkpointRecord(c.topic, c.id, c.stamp(Checkpoint{EndLSN: want}))
	if err != nil {
		return err
	}
	r.Done = c.acks
	if err := p.prod.Send(ctx, r); err != nil {
		return err
	}
	c.inFlight, c.pending = true, want
	return nil
}

// checkpointAcked completes an at-least-once checkpoint record.
func (p *Pipeline) checkpointAcked(r *kafka.Record) error {
	c := p.cp
	c.inFlight = false
	if r.Err != nil {
		return fmt.Errorf("publisher: write checkpoint %s to %q: %w", c.pending, c.topic, r.Err)
	}
	if uint64(c.pending) > c.covered.Load() {
		c.covered.Store(uint64(c.pending))
	}
	return nil
}

// finalCheckpoint runs once every event was acknowledged after a stop: it
// commits the open Kafka transaction (exactly-once) and checkpoints what is
// done, so the final confirmation covers it and a restart re-sends nothing.
func (p *Pipeline) finalCheckpoint(ctx context.Context) error {
	c := p.cp
	if c == nil {
		return nil
	}
	if p.eos() {
		if c.open {
			if err := p.commitKafkaTxn(ctx); err != nil {
				return err
			}
		}
		return p.tick(ctx)
	}
	if c.inFlight {
		select {
		case r := <-c.acks:
			if err := p.checkpointAcked(r); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	end := max(p.wm.Confirmed(), pglogrepl.LSN(c.want.Load()))
	if end <= pglogrepl.LSN(c.covered.Load()) {
		return nil
	}
	if err := p.writeCheckpoint(ctx, Checkpoint{EndLSN: end}); err != nil {
		return err
	}
	c.covered.Store(uint64(end))
	return nil
}

// resetCheckpoint writes a checkpoint at the slot's position, before the
// session streams: the gap before it was accepted. prev's id high mark and
// generation carry over.
func resetCheckpoint(ctx context.Context, prod Producer, cfg Config, id Identity, at pglogrepl.LSN, prev *Checkpoint) error {
	cp := Checkpoint{EndLSN: at}
	if prev != nil {
		cp.MaxOutboxID, cp.Generation = prev.MaxOutboxID, prev.Generation
	}
	return WriteCheckpoint(ctx, prod, cfg, id, cp)
}

// WriteCheckpoint writes cp as id's checkpoint and waits for it (and, in
// exactly-once mode, commits it): outboxd checkpoint reset.
func WriteCheckpoint(ctx context.Context, prod Producer, cfg Config, id Identity, cp Checkpoint) error {
	at := cp.EndLSN
	r, err := checkpointRecord(cfg.CheckpointTopic, id, cp)
	if err != nil {
		return err
	}
	done := make(chan *kafka.Record, 1)
	r.Done = done
	if err := prod.Send(ctx, r); err != nil {
		return err
	}
	select {
	case r := <-done:
		if r.Err != nil {
			return fmt.Errorf("publisher: reset the checkpoint to %s: %w", at, r.Err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if cfg.Delivery == ExactlyOnce {
		if err := prod.(committer).Commit(ctx); err != nil {
			return fmt.Errorf("publisher: commit the checkpoint reset to %s: %w", at, err)
		}
	}
	return nil
}
