package publisher

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// plain is at-least-once delivery without checkpoints: an acknowledged
// event is done, and the done prefix may be confirmed as it is.
type plain struct{ wm *Watermark }

func (plain) skip(replication.Begin) bool   { return false }
func (plain) prepare(*kafka.Record)         {}
func (plain) produced(*kafka.Record, int64) {}
func (d plain) acked(t *txn)                { d.wm.Ack(t) }
func (plain) interval() time.Duration       { return 0 }
func (plain) tick(context.Context) error    { return nil }
func (plain) finish(context.Context) error  { return nil }
func (plain) cut(context.Context) error     { return nil }
func (plain) abort() error                  { return nil }

func (plain) committed(context.Context, replication.Begin, replication.Commit, bool, bool) error {
	return nil
}

func (plain) checkpointAcks() <-chan *kafka.Record      { return nil }
func (plain) checkpointAcked(*kafka.Record) error       { return nil }
func (plain) confirmable(w pglogrepl.LSN) pglogrepl.LSN { return w }
