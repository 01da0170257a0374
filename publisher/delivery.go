package publisher

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// Delivery modes (Config.Delivery).
const (
	AtLeastOnce = "at-least-once"
	ExactlyOnce = "exactly-once"
)

// delivery is how a pipeline's acknowledged records become a position that
// may be confirmed. There are three, each a type in its own file, chosen
// once per session by newDelivery:
//
//   - plain: no checkpoints; an acknowledged event is done (at-least-once).
//   - checkpointed: at-least-once with a checkpoint topic; a position is
//     confirmed once a checkpoint record holding it was acknowledged.
//   - transactional: exactly-once; Postgres transactions are grouped into
//     Kafka transactions, each with its checkpoint, and an event is done
//     when its Kafka transaction committed.
//
// All methods but confirmable run on the pipeline's reader goroutine;
// acked runs on its ack goroutine; confirmable on the stream's.
type delivery interface {
	// skip reports whether a transaction beginning with b is already in
	// Kafka (below the checkpoint read at start).
	skip(b replication.Begin) bool
	// prepare adds what this mode puts on every event's record (the
	// origin header).
	prepare(r *kafka.Record)
	// produced notes an event's record held for the producer, and the
	// event's row id (0: none, see outbox.Event.IDIsLSN).
	produced(r *kafka.Record, rowID int64)
	// acked is the success path of a record for the watermark.
	acked(t *txn)
	// committed runs after a Postgres transaction's Commit was read and
	// added to the watermark; skipped says the transaction was skipped,
	// more that another one waits.
	committed(ctx context.Context, b replication.Begin, c replication.Commit, more, skipped bool) error
	// interval is how often tick runs (0: never).
	interval() time.Duration
	// tick moves the checkpoint to what the stream wants to confirm when
	// the pipeline has nothing else to commit.
	tick(ctx context.Context) error
	// checkpointAcks delivers the acknowledgements of checkpoint records
	// the reader does not wait for (nil: none), for checkpointAcked.
	checkpointAcks() <-chan *kafka.Record
	checkpointAcked(r *kafka.Record) error
	// finish runs once every event was acknowledged after a stop: it
	// checkpoints what is done, so the final confirmation covers it.
	finish(ctx context.Context) error
	// cut runs instead of finish when the stream ended inside a PostgreSQL
	// transaction: at-least-once modes keep what is done of the
	// transactions before it; exactly-once commits nothing, since the open
	// Kafka transaction holds part of the cut one (abort follows).
	cut(ctx context.Context) error
	// confirmable caps want at what may be confirmed (see gate).
	confirmable(want pglogrepl.LSN) pglogrepl.LSN
	// abort ends the session's producer side after Run returned: in
	// exactly-once mode it aborts the open Kafka transaction.
	abort() error
}

// newDelivery chooses the session's delivery mode: plain without
// checkpoints, else checkpointed or, for exactly-once, transactional —
// which needs a Transactional producer and says so once, here.
func newDelivery(p *Pipeline, cp *checkpointing) (delivery, error) {
	switch {
	case cp == nil:
		return plain{p.wm}, nil
	case p.cfg.Delivery != ExactlyOnce:
		return &checkpointed{checkpointing: cp, p: p}, nil
	}
	tp, ok := p.prod.(Transactional)
	if !ok {
		return nil, fmt.Errorf("publisher: exactly-once delivery needs a transactional producer (Commit, Abort), got %T", p.prod)
	}
	return &transactional{checkpointing: cp, p: p, prod: tp}, nil
}
