package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// transactional is exactly-once delivery: whole Postgres transactions are
// grouped into Kafka transactions, each with the checkpoint of its last
// Postgres transaction inside, and an event is done — its position may be
// confirmed — only once its Kafka transaction committed.
type transactional struct {
	*checkpointing
	p    *Pipeline
	prod Transactional

	// The open Kafka transaction (the reader's goroutine).
	open   bool
	events int
	since  time.Time
	last   Checkpoint // the last Postgres transaction in it
	heldMu sync.Mutex
	held   []*txn // events acknowledged, waiting for the commit
}

func (d *transactional) skip(b replication.Begin) bool { return d.skipBefore(b, d.p.log) }
func (d *transactional) interval() time.Duration       { return d.p.cfg.CheckpointInterval }

// The reader waits for each checkpoint record itself (written).
func (d *transactional) checkpointAcks() <-chan *kafka.Record { return nil }
func (d *transactional) checkpointAcked(*kafka.Record) error  { return nil }

// produced opens the Kafka transaction.
func (d *transactional) produced(_ *kafka.Record, rowID int64) {
	d.noteID(rowID)
	if !d.open {
		d.open, d.since = true, time.Now()
	}
	d.events++
}

// acked holds the event until its Kafka transaction committed.
func (d *transactional) acked(t *txn) {
	d.heldMu.Lock()
	d.held = append(d.held, t)
	d.heldMu.Unlock()
}

// committed closes the Kafka transaction when it is big or old enough, or
// when nothing else is waiting (low latency when quiet).
func (d *transactional) committed(ctx context.Context, b replication.Begin, c replication.Commit, more, skipped bool) error {
	if skipped {
		return nil
	}
	d.noteCommitTime(c.CommitTime)
	if !d.open {
		return nil
	}
	d.last = Checkpoint{EndLSN: c.EndLSN, CommitLSN: c.CommitLSN, Xid: b.Xid, CommitTime: c.CommitTime}
	if more && d.events < d.p.cfg.TxnMaxEvents && time.Since(d.since) < d.p.cfg.TxnMaxAge {
		return nil
	}
	return d.commit(ctx)
}

// commit waits for every record of the Kafka transaction, adds the
// checkpoint of its last Postgres transaction, commits, and only then lets
// the watermark (and so the slot) move past them.
func (d *transactional) commit(ctx context.Context) error {
	// The checkpoint goes out at once, beside the records still in flight:
	// the commit makes them visible together, so their order does not matter
	// and the round trips overlap.
	cp := d.last
	if err := d.send(ctx, d.prod, cp); err != nil {
		return err
	}
	if err := d.p.drain(ctx); err != nil {
		return err
	}
	if err := d.written(ctx, cp); err != nil {
		return err
	}
	if err := d.prod.Commit(ctx); err != nil {
		return fmt.Errorf("publisher: commit the Kafka transaction of %d events up to %s: %w", d.events, d.last.EndLSN, err)
	}
	d.covered.Store(uint64(d.last.EndLSN))
	d.heldMu.Lock()
	held := d.held
	d.held = nil
	d.heldMu.Unlock()
	for _, t := range held {
		d.p.wm.Ack(t)
	}
	d.p.m.ConfirmedLSN.Set(float64(d.p.wm.Confirmed()))
	d.open, d.events = false, 0
	return nil
}

// tick commits a checkpoint of what the stream wants to confirm when no
// Kafka transaction is open (the next commit covers it otherwise).
func (d *transactional) tick(ctx context.Context) error {
	want, ok := d.wanted()
	if !ok || d.open {
		return nil
	}
	if err := d.write(ctx, d.prod, Checkpoint{EndLSN: want}); err != nil {
		return err
	}
	if err := d.prod.Commit(ctx); err != nil {
		return fmt.Errorf("publisher: commit the checkpoint %s: %w", want, err)
	}
	d.covered.Store(uint64(want))
	return nil
}

// finish commits the open Kafka transaction and checkpoints what is done.
func (d *transactional) finish(ctx context.Context) error {
	if d.open {
		if err := d.commit(ctx); err != nil {
			return err
		}
	}
	return d.tick(ctx)
}

// cut commits nothing: the open Kafka transaction holds rows of the cut
// PostgreSQL transaction, and committing it would put them in Kafka beside a
// checkpoint that does not cover them, so a restart sends them again
// (duplicates for read_committed readers). abort, which the session runs
// next, discards it; the transactions before the cut one are sent again too.
func (d *transactional) cut(context.Context) error { return nil }

// abort aborts the Kafka transaction a session leaves open (a clean stop
// commits it first: nothing to abort). The abort is also how a zombie
// learns it was fenced — another instance took the slot over while it was
// frozen — and then it stops for good instead of waiting as a standby.
// Other abort failures are left to the next producer, whose InitProducerId
// aborts the transaction anyway.
func (d *transactional) abort() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.prod.Abort(ctx); errors.Is(err, kafka.ErrFenced) {
		return fmt.Errorf("publisher: this instance was fenced: another outboxd took the slot over and publishes now; stopping without confirming anything: %w", err)
	}
	return nil
}
