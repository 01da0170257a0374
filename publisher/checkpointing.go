package publisher

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// checkpointing is the checkpoint state both checkpointing modes share
// (checkpointed, transactional). The stream asks to confirm positions
// (confirmable); what it may confirm is what the checkpoint topic holds.
// Owned by the pipeline's reader goroutine, except the atomics.
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

	acks chan *kafka.Record // the checkpoint records back (Record.Done)
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

// noteID remembers an event's row id for MaxOutboxID (0: the event has
// none, e.g. an outbox_emit message, whose id is its LSN).
func (c *checkpointing) noteID(rowID int64) {
	if rowID > c.maxID.Load() {
		c.maxID.Store(rowID)
	}
}

// prepare adds the origin header, when this shape sends it.
func (c *checkpointing) prepare(r *kafka.Record) {
	if c.origin != nil {
		r.Headers = append(r.Headers, kafka.Header{Key: outbox.HeaderOrigin, Value: c.origin})
	}
}

// confirmable lets the stream confirm want only as far as the checkpoint
// topic holds it, and remembers want for the next checkpoint (tick).
func (c *checkpointing) confirmable(want pglogrepl.LSN) pglogrepl.LSN {
	for {
		old := c.want.Load()
		if uint64(want) <= old || c.want.CompareAndSwap(old, uint64(want)) {
			break
		}
	}
	return min(want, pglogrepl.LSN(c.covered.Load()))
}

// skipBefore reports whether a transaction beginning with b is already in
// Kafka.
func (c *checkpointing) skipBefore(b replication.Begin, log *zap.Logger) bool {
	if b.FinalLSN >= c.skipBelow {
		return false
	}
	c.skipped++
	if c.skipped == 1 {
		log.Info("skipping transactions the checkpoint says are in Kafka already",
			zap.Stringer("checkpoint", c.skipBelow))
	}
	return true
}

// noteCommitTime remembers the commit time of a transaction read.
func (c *checkpointing) noteCommitTime(t time.Time) {
	if !t.IsZero() {
		c.lastCommit.Store(t.UnixNano())
	}
}

// wanted is the highest position the stream wanted to confirm and the
// checkpoint topic does not hold yet (ok false: none).
func (c *checkpointing) wanted() (pglogrepl.LSN, bool) {
	want := pglogrepl.LSN(c.want.Load())
	return want, want > pglogrepl.LSN(c.covered.Load())
}

// send sends a checkpoint record; its acknowledgement comes back on acks
// (written).
func (c *checkpointing) send(ctx context.Context, prod outbox.Producer, cp Checkpoint) error {
	r, err := checkpointRecord(c.topic, c.id, c.stamp(cp))
	if err != nil {
		return err
	}
	r.Done = c.acks
	return prod.Send(ctx, r)
}

// written waits for the acknowledgement of the checkpoint sent.
func (c *checkpointing) written(ctx context.Context, cp Checkpoint) error {
	select {
	case r := <-c.acks:
		if r.Err != nil {
			return fmt.Errorf("publisher: write checkpoint %s to %q: %w", cp.EndLSN, c.topic, r.Err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write sends a checkpoint record and waits for its acknowledgement.
func (c *checkpointing) write(ctx context.Context, prod outbox.Producer, cp Checkpoint) error {
	if err := c.send(ctx, prod, cp); err != nil {
		return err
	}
	return c.written(ctx, cp)
}

// resetCheckpoint writes a checkpoint at the slot's position, before the
// session streams: the gap before it was accepted. prev's id high mark and
// generation carry over.
func resetCheckpoint(ctx context.Context, prod outbox.Producer, cfg Config, id Identity, at pglogrepl.LSN, prev *Checkpoint) error {
	cp := Checkpoint{EndLSN: at}
	if prev != nil {
		cp.MaxOutboxID, cp.Generation = prev.MaxOutboxID, prev.Generation
	}
	if err := writeCheckpoint(ctx, prod, cfg, id, cp); err != nil {
		return fmt.Errorf("publisher: reset the checkpoint to %s: %w", cp.EndLSN, err)
	}
	return nil
}

// WriteCheckpoint writes cp as id's checkpoint in an epoch of its own, above
// every epoch before it (a read barrier first: the epoch is one past its
// offset, as a session's), and waits for it (and, in exactly-once mode,
// commits it, so prod must be Transactional then): outboxd checkpoint reset.
func WriteCheckpoint(ctx context.Context, prod outbox.Producer, cfg Config, id Identity, cp Checkpoint) error {
	_, epoch, err := writeReadBarrier(ctx, prod, cfg, id)
	if err != nil {
		return err
	}
	id.Epoch = epoch
	if err := writeCheckpoint(ctx, prod, cfg, id, cp); err != nil {
		return fmt.Errorf("publisher: reset the checkpoint to %s: %w", cp.EndLSN, err)
	}
	return nil
}

// writeCheckpoint writes cp as id's checkpoint in id's epoch, waits for it
// and, in exactly-once mode, commits it.
func writeCheckpoint(ctx context.Context, prod outbox.Producer, cfg Config, id Identity, cp Checkpoint) error {
	r, err := checkpointRecord(cfg.CheckpointTopic, id, cp)
	if err != nil {
		return err
	}
	return writeCommitted(ctx, prod, cfg, r)
}

// takeEpoch makes the session's epoch hold the checkpoint it starts from
// (unless it was written there already), then tombstones the identity's
// keys of earlier epochs, so that the topic keeps about one record per
// identity. In that order: until the new epoch holds a record, the earlier
// ones are the checkpoint. A paused earlier owner may still write under its
// own key afterwards; the reader ignores it (a lower epoch), and the next
// session tombstones it again.
func takeEpoch(ctx context.Context, prod outbox.Producer, cfg Config, id Identity, cp *Checkpoint, written bool, keys []string) error {
	if !written {
		if err := writeCheckpoint(ctx, prod, cfg, id, *cp); err != nil {
			return fmt.Errorf("publisher: write the checkpoint %s in this session's epoch %d: %w", cp.EndLSN, id.Epoch, err)
		}
	}
	var tombs []*kafka.Record
	for _, k := range keys {
		if _, e, ok := SplitCheckpointKey(k); ok && e < id.Epoch {
			tombs = append(tombs, &kafka.Record{Topic: cfg.CheckpointTopic, Key: []byte(k), Timestamp: time.Now()})
		}
	}
	if len(tombs) == 0 {
		return nil
	}
	if err := writeCommitted(ctx, prod, cfg, tombs...); err != nil {
		return fmt.Errorf("publisher: tombstone the checkpoints of earlier epochs in %q: %w", cfg.CheckpointTopic, err)
	}
	return nil
}

// writeReadBarrier writes a tombstone under the identity's barrier key to
// the checkpoint topic (committed, in exactly-once mode) before the
// session reads its checkpoint, and returns where it landed: the read must
// reach past it. A leader that was replaced while it was paused answers for
// a moment with the log it had then — a checkpoint older than the one
// committed since, which would read as a gap between the slot and the
// checkpoint (a halt) or re-publish what Kafka holds. The barrier was taken
// by a real leader (acks=all), so a log that holds it holds every
// checkpoint before it. A tombstone: no reader ever takes it for a value.
//
// It also returns the session's epoch, one past the barrier's offset
// (Identity.Epoch): the topic has one partition, so a barrier written later
// has a higher offset.
func writeReadBarrier(ctx context.Context, prod outbox.Producer, cfg Config, id Identity) ([]kafka.Barrier, int64, error) {
	r := &kafka.Record{Topic: cfg.CheckpointTopic, Key: []byte(id.Key() + "/read-barrier"), Timestamp: time.Now()}
	if err := writeCommitted(ctx, prod, cfg, r); err != nil {
		return nil, 0, fmt.Errorf("publisher: write the checkpoint read barrier to %q: %w", cfg.CheckpointTopic, err)
	}
	return []kafka.Barrier{{Partition: r.Partition, Offset: r.Offset}}, r.Offset + 1, nil
}

// writeCommitted sends rs, waits for their acknowledgements and, in
// exactly-once mode, commits them (prod must be Transactional then).
func writeCommitted(ctx context.Context, prod outbox.Producer, cfg Config, rs ...*kafka.Record) error {
	var tp Transactional
	if cfg.Delivery == ExactlyOnce {
		var ok bool
		if tp, ok = prod.(Transactional); !ok {
			return fmt.Errorf("publisher: exactly-once checkpoints need a transactional producer (Commit, Abort), got %T", prod)
		}
	}
	done := make(chan *kafka.Record, len(rs))
	for _, r := range rs {
		r.Done = done
		r.Urgent = true // waited on alone: the linger would only delay it
		if err := prod.Send(ctx, r); err != nil {
			return err
		}
	}
	var failed error
	for range rs {
		select {
		case r := <-done:
			if r.Err != nil && failed == nil {
				failed = r.Err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if failed != nil {
		return failed
	}
	if tp != nil {
		if err := tp.Commit(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	return nil
}
