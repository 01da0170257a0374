package publisher

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// checkpointed is at-least-once delivery with a checkpoint topic: an
// acknowledged event is done, but a position is confirmed only once a
// checkpoint record holding it was acknowledged. One checkpoint record is in
// flight at a time; the reader does not wait for it.
type checkpointed struct {
	*checkpointing
	p        *Pipeline
	inFlight bool          // a checkpoint record is out
	pending  pglogrepl.LSN // its position
}

func (d *checkpointed) skip(b replication.Begin) bool         { return d.skipBefore(b, d.p.log) }
func (d *checkpointed) produced(_ *kafka.Record, rowID int64) { d.noteID(rowID) }
func (d *checkpointed) acked(t *txn)                          { d.p.wm.Ack(t) }
func (d *checkpointed) interval() time.Duration               { return d.p.cfg.CheckpointInterval }
func (d *checkpointed) abort() error                          { return nil }

func (d *checkpointed) checkpointAcks() <-chan *kafka.Record { return d.acks }

// committed checkpoints as soon as the stream wants more (one record in
// flight at a time), which keeps what a crash re-sends small.
func (d *checkpointed) committed(ctx context.Context, _ replication.Begin, c replication.Commit, _, skipped bool) error {
	if !skipped {
		d.noteCommitTime(c.CommitTime)
	}
	return d.tick(ctx)
}

// tick sends a checkpoint record for what the stream wants to confirm,
// unless one is in flight.
func (d *checkpointed) tick(ctx context.Context) error {
	want, ok := d.wanted()
	if !ok || d.inFlight {
		return nil
	}
	if err := d.send(ctx, d.p.prod, Checkpoint{EndLSN: want}); err != nil {
		return err
	}
	d.inFlight, d.pending = true, want
	return nil
}

// checkpointAcked completes the checkpoint record in flight.
func (d *checkpointed) checkpointAcked(r *kafka.Record) error {
	d.inFlight = false
	if r.Err != nil {
		return fmt.Errorf("publisher: write checkpoint %s to %q: %w", d.pending, d.topic, r.Err)
	}
	if uint64(d.pending) > d.covered.Load() {
		d.covered.Store(uint64(d.pending))
	}
	return nil
}

// cut waits for what is in flight and checkpoints the transactions done
// before the cut one: the watermark never passes a transaction without its
// Commit, so none of the cut one is covered.
func (d *checkpointed) cut(ctx context.Context) error {
	if err := d.p.drain(ctx); err != nil {
		return err
	}
	return d.finish(ctx)
}

// finish waits for the checkpoint record in flight and writes one for
// everything done.
func (d *checkpointed) finish(ctx context.Context) error {
	if d.inFlight {
		select {
		case r := <-d.acks:
			if err := d.checkpointAcked(r); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	end := max(d.p.wm.Confirmed(), pglogrepl.LSN(d.want.Load()))
	if end <= pglogrepl.LSN(d.covered.Load()) {
		return nil
	}
	if err := d.write(ctx, d.p.prod, Checkpoint{EndLSN: end}); err != nil {
		return err
	}
	d.covered.Store(uint64(end))
	return nil
}
