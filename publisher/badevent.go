package publisher

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// BadEventError halts the service on a bad event (a row that cannot become
// a record) when no dead-letter topic is set. Nothing past the event's
// transaction is confirmed. It unwraps to replication.ErrBadValue (fatal).
type BadEventError struct {
	Event replication.BadEvent
	Xid   uint32
	// Skipping are the LSNs already skipped (Config.SkipBadEvents).
	Skipping []pglogrepl.LSN
}

func (e *BadEventError) Error() string {
	where := fmt.Sprintf("transaction %d", e.Xid)
	if e.Event.Table != "" {
		where += ", table " + e.Event.Table
	}
	if e.Event.ID != "" {
		where += ", id " + e.Event.ID
	}
	var flags strings.Builder
	for _, l := range append(slices.Clone(e.Skipping), e.Event.LSN) {
		fmt.Fprintf(&flags, " --skip-bad-event %s", l)
	}
	return fmt.Sprintf("bad event at LSN %s (%s): %s; nothing was confirmed past it. "+
		"To skip exactly this event (and nothing else), start outboxd again with%s; "+
		"or set --dead-letter-topic to divert bad events there and go on",
		e.Event.LSN, where, e.Event.Reason, flags.String())
}

func (e *BadEventError) Unwrap() error { return replication.ErrBadValue }

// badCause is the cause a bad event is dead-lettered with: it matches
// kafka.ErrPoison, so the pipeline's poison path diverts it.
type badCause struct{ reason string }

func (c *badCause) Error() string        { return c.reason }
func (c *badCause) Is(target error) bool { return target == kafka.ErrPoison }

// badEvent handles a bad event of transaction t: skipped when it is the one
// SkipBadEvent names, else diverted to the dead-letter topic — counted in
// the transaction's watermark like any event, so nothing is confirmed past
// it before the dead-letter topic acknowledged it — or, without one, a
// BadEventError.
//
// budgeted is the room the stream took for the event (0: none): it goes
// back when the event is skipped or halts, and becomes the dead-letter
// record's room, which is never waited for — the record is dead-lettered
// and released in this call, while waiting could hang for good behind
// events the stream handed over after this one.
func (p *Pipeline) badEvent(ctx context.Context, t *txn, b replication.Begin, bad *replication.BadEvent, budgeted int64) error {
	fields := []zap.Field{zap.Stringer("lsn", bad.LSN), zap.Uint32("xid", b.Xid), zap.String("table", bad.Table), zap.String("reason", bad.Reason)}
	if p.dlq == nil || slices.Contains(p.cfg.SkipBadEvents, bad.LSN) {
		if budgeted > 0 {
			p.lim.releaseHandedOver(budgeted)
		}
	}
	if slices.Contains(p.cfg.SkipBadEvents, bad.LSN) {
		p.m.BadEvents.WithLabelValues("skipped").Inc()
		p.log.Warn("skipped the bad event --skip-bad-event names", fields...)
		return nil
	}
	if p.dlq == nil {
		p.m.BadEvents.WithLabelValues("halted").Inc()
		// Publish what came before it first, so that the halt leaves
		// Kafka at the bad event.
		if err := p.drain(ctx); err != nil {
			return err
		}
		return &BadEventError{Event: *bad, Xid: b.Xid, Skipping: p.cfg.SkipBadEvents}
	}
	r := badRecord(b, bad)
	r.Meta = t
	size := recordCost(r) // what handleResult releases
	if err := p.flush(ctx); err != nil {
		return err
	}
	if budgeted > 0 {
		p.lim.resize(budgeted, size)
	} else {
		p.lim.take(size)
	}
	p.wm.Add(t)
	p.m.InFlightEvents.Inc()
	p.m.InFlightBytes.Add(float64(size))
	r.Err = &badCause{reason: bad.Reason}
	p.m.BadEvents.WithLabelValues("dead_lettered").Inc()
	p.log.Warn("bad event: diverting it to the dead-letter topic", fields...)
	return p.handleResult(ctx, r)
}

// badRecord is what the dead-letter topic receives for a bad event: the
// row's raw column texts as a JSON object (a column's text, or null), and
// where it came from in headers.
func badRecord(b replication.Begin, bad *replication.BadEvent) *kafka.Record {
	cols := make(map[string]*string, len(bad.Columns))
	for _, c := range bad.Columns {
		if c.Null {
			cols[c.Name] = nil
			continue
		}
		v := string(c.Value)
		cols[c.Name] = &v
	}
	value, _ := json.Marshal(cols) // a map of strings always marshals
	hs := []kafka.Header{
		{Key: kafka.HeaderDLQSourceLSN, Value: []byte(bad.LSN.String())},
		{Key: kafka.HeaderDLQSourceXid, Value: strconv.AppendUint(nil, uint64(b.Xid), 10)},
		{Key: kafka.HeaderDLQSourceTable, Value: []byte(bad.Table)},
	}
	if bad.ID != "" {
		hs = append(hs, kafka.Header{Key: kafka.HeaderDLQEventID, Value: []byte(bad.ID)})
	}
	return &kafka.Record{Value: value, Headers: hs, EventID: bad.ID}
}

// unpublishable reports an event of transaction t that can never be
// published as a bad event, with the event's fields as its columns: one
// with no topic while no default topic is set, one whose own headers name
// a header outboxd sets (the record would carry it twice), and, without a
// dead-letter topic (with one, the producer's poison path diverts it), one
// over MaxRecordBytes.
func (p *Pipeline) unpublishable(t *txn, m *replication.Message) (replication.BadEvent, bool) {
	ev := &m.Event
	var reason string
	name, reserved := p.cfg.Mapping.ReservedIn(ev.Headers)
	switch {
	case ev.Topic == "" && p.cfg.DefaultTopic == "":
		reason = errNoTopic.Error()
	case reserved:
		reason = fmt.Sprintf("sets header %q, which outboxd sets itself", name)
	case p.dlq == nil && p.cfg.MaxRecordBytes > 0 && p.mayBeOversized(ev):
		r := outbox.NewRecord(ev, &p.cfg.Mapping, t.commitTime)
		p.mode.prepare(r) // produce adds the origin header too: measure the record Kafka gets
		if n := r.Size() + kafka.RecordOverhead; n > p.cfg.MaxRecordBytes {
			reason = fmt.Sprintf("record of %d bytes is larger than the producer's max message bytes (%d, --kafka-max-message-bytes)", r.Size(), p.cfg.MaxRecordBytes)
		}
	}
	if reason == "" {
		return replication.BadEvent{}, false
	}
	return eventBad(m, reason), true
}

// eventBad is event m as a bad event for reason, the event's fields as its
// columns.
func eventBad(m *replication.Message, reason string) replication.BadEvent {
	ev := &m.Event
	cols := []replication.ColumnText{
		{Name: "id", Value: []byte(ev.IDString())},
		{Name: "key", Value: []byte(ev.AggregateID)},
		{Name: "payload", Value: ev.Payload, Null: ev.Payload == nil},
	}
	for _, h := range ev.Headers {
		cols = append(cols, replication.ColumnText{Name: "header " + h.Key, Value: []byte(h.Value)})
	}
	return replication.BadEvent{LSN: m.WALStart, ID: ev.IDString(), Reason: reason, Columns: cols}
}

// mayBeOversized is a cheap test that lets most events skip building their
// record twice: encoding (a JSON string escapes a byte into at most 6)
// and outboxd's own headers cannot take a smaller event over the limit.
func (p *Pipeline) mayBeOversized(ev *replication.Event) bool {
	n := int(ev.Size() - replication.EventOverhead) // its variable bytes (and the topic's: a bound)
	return 6*n+2*len(ev.AggregateID)+512+kafka.RecordOverhead > p.cfg.MaxRecordBytes
}
