package replication

import (
	"fmt"
	"time"
)

// Type OIDs the decoder treats specially.
const (
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidText        = 25
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// role is what a column of the outbox table means to an Event.
type role uint8

const (
	roleNone role = iota
	roleID
	roleAggregateID
	roleTopic
	rolePayload
	roleCreatedAt
	roleEventType
	roleHeaders
	numRoles
)

// relation is what the decoder remembers of a Relation message.
type relation struct {
	ncols  int
	outbox bool
	// The fields below are set for the outbox relation only.
	roles   []role // roles[i] is the role of column i
	names   []string
	oid     [numRoles]uint32
	missing error // *MissingColumnError, *ColumnTypeError or nil
	// tmpl[i] is the column of placeholder i of the topic template.
	tmpl []int
	// hdr[i] is the column of HeaderColumns[i].
	hdr []int
}

func (d *Decoder) roleOf(col []byte) role {
	switch string(col) {
	case d.cols.ID:
		return roleID
	case d.cols.AggregateID:
		return roleAggregateID
	case d.cols.Topic:
		return roleTopic
	case d.cols.Payload:
		return rolePayload
	case d.cols.CreatedAt:
		return roleCreatedAt
	case d.cols.EventType:
		return roleEventType
	case d.cols.Headers:
		return roleHeaders
	}
	return roleNone
}

// event builds the Event of an outbox row whose values spans locate in b.
func (d *Decoder) event(b []byte, rel *relation, spans *[numRoles]span, odd span) (Message, error) {
	var ev Event
	idKnown := false
	badValue := func(s span, detail string) error {
		row, id := "outbox row: ", ""
		if idKnown {
			id = ev.IDString()
			row = "outbox row id=" + id + ": "
		}
		return &DecodeError{MsgType: 'I', Offset: s.start, Err: ErrBadValue,
			Detail: fmt.Sprintf("%scolumn %q %s", row, rel.names[s.col], detail), bad: d.badRow(b, rel, id)}
	}
	// required returns the text value of a required column.
	required := func(s span) ([]byte, error) {
		switch s.kind {
		case 't':
			return b[s.start:s.end], nil
		case 'n':
			return nil, badValue(s, "is NULL")
		default:
			return nil, badValue(s, kindDetail(s.kind))
		}
	}

	v, err := required(spans[roleID])
	if err != nil {
		return Message{}, err
	}
	var ok bool
	if rel.oid[roleID] == oidUUID {
		ev.UUID = string(v)
	} else if ev.ID, ok = parseInt64(v); !ok {
		return Message{}, badValue(spans[roleID], "is not an integer: "+quote(v))
	}
	idKnown = true
	if odd.col >= 0 {
		return Message{}, badValue(odd, kindDetail(odd.kind))
	}

	if v, err = required(spans[roleAggregateID]); err != nil {
		return Message{}, err
	}
	ev.AggregateID = string(v)

	s := spans[rolePayload]
	switch v, err = required(s); {
	case s.kind == 'n' && d.nullPayload:
		// ev.Payload stays nil: a tombstone.
	case err != nil:
		return Message{}, err
	case rel.oid[rolePayload] == oidBytea:
		if ev.Payload, ok = decodeByteaHex(v); !ok {
			return Message{}, badValue(s, "is not bytea in hex format: "+quote(v))
		}
	default:
		ev.Payload = make([]byte, len(v))
		copy(ev.Payload, v)
	}

	if err := d.optionalColumns(b, rel, spans, &ev, badValue); err != nil {
		return Message{}, err
	}
	return Message{Kind: KindEvent, Event: ev}, nil
}

// optionalColumns sets what the row's optional columns give ev: topic
// (from the column or the template), event type, creation time, headers.
func (d *Decoder) optionalColumns(b []byte, rel *relation, spans *[numRoles]span, ev *Event, badValue func(span, string) error) error {
	var ok bool
	if s := spans[roleTopic]; s.kind == 't' {
		ev.Topic = d.intern(b[s.start:s.end], &d.lastTopic)
	}
	if d.tmpl != nil {
		ev.Topic = d.renderTopic(b, rel)
	}
	if s := spans[roleEventType]; s.kind == 't' {
		ev.EventType = d.intern(b[s.start:s.end], &d.lastEventType)
	}
	if s := spans[roleCreatedAt]; s.kind == 't' {
		v := b[s.start:s.end]
		switch rel.oid[roleCreatedAt] {
		case oidInt8, oidInt4:
			ms, ok := parseInt64(v)
			if !ok {
				return badValue(s, "is not an integer: "+quote(v))
			}
			ev.CreatedAt = time.UnixMilli(ms).UTC()
		default:
			if ev.CreatedAt, ok = parseTimestamp(v); !ok {
				return badValue(s, "is not an ISO timestamp: "+quote(v))
			}
		}
	}
	for i, c := range rel.hdr {
		if s := d.row[c]; s.kind == 't' {
			ev.Headers = append(ev.Headers, Header{Key: d.hdrCols[i].Header, Value: string(b[s.start:s.end])})
		}
	}
	if s := spans[roleHeaders]; s.kind == 't' {
		var bad string
		if ev.Headers, bad = d.appendJSONHeaders(ev.Headers, b[s.start:s.end]); bad != "" {
			return badValue(s, bad)
		}
	}
	return nil
}

func kindDetail(kind byte) string {
	switch kind {
	case 'u':
		return "is an unchanged TOAST value, which an insert cannot carry"
	case 'b':
		return "is in binary format; the stream must use text format"
	}
	return fmt.Sprintf("has value kind %q", kind)
}
