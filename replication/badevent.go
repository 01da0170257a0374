package replication

import (
	"errors"

	"github.com/jackc/pglogrepl"
)

// BadEvent is an outbox row, or an authentic outbox_emit message, that
// cannot become a record: a NULL where a value is required, an id that is
// not an integer, a header that is not a string or is one outboxd sets
// itself, ... The stream hands it on (KindBad) instead of
// failing, so that the consumer decides: divert it to the dead-letter topic,
// skip it when told to, or halt naming it.
type BadEvent struct {
	// LSN is the position of the row's change (XLogData.WALStart), unique
	// per event: what --skip-bad-event names. Set by the stream.
	LSN pglogrepl.LSN
	// Table is the outbox table, schema-qualified; empty for a message.
	Table string
	// ID is the event id's text when it was read (a message's: its LSN as
	// a decimal, the outbox-id it would have had); empty otherwise.
	ID string
	// Reason says what is wrong (the decode error's text).
	Reason string
	// Columns are the row's values as sent, in column order; a message's
	// fields (topic, key, headers, payload), or its content when they do
	// not parse.
	Columns []ColumnText
}

// Size is what a bad event costs the budget, as Event.Size: its bytes plus
// EventOverhead.
func (b *BadEvent) Size() int64 {
	n := len(b.Table) + len(b.ID) + len(b.Reason)
	for _, c := range b.Columns {
		n += len(c.Name) + len(c.Value)
	}
	return int64(n) + EventOverhead
}

// ColumnText is one column of a bad row: its text, or NULL.
type ColumnText struct {
	Name  string
	Value []byte // the text as sent; for a 'u' (unchanged TOAST) value, empty
	Null  bool
}

// asBadEvent turns a decode error that names a bad outbox row into a
// KindBad message; any other error is returned as is.
func asBadEvent(err error) (Message, error) {
	var de *DecodeError
	if !errors.As(err, &de) || de.bad == nil {
		return Message{}, err
	}
	b := *de.bad
	b.Reason = de.Error()
	return Message{Kind: KindBad, Bad: b}, nil
}

// badRow is the BadEvent of the outbox row in d.row, whose values are in b.
func (d *Decoder) badRow(b []byte, rel *relation, id string) *BadEvent {
	ev := &BadEvent{Table: d.schema + "." + d.table, ID: id, Columns: make([]ColumnText, len(d.row))}
	for i, s := range d.row {
		c := ColumnText{Name: rel.names[i], Null: s.kind == 'n'}
		if s.kind == 't' || s.kind == 'b' {
			c.Value = append([]byte(nil), b[s.start:s.end]...)
		}
		ev.Columns[i] = c
	}
	return ev
}
