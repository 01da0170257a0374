package outbox

import (
	"strconv"
	"time"
)

// Event is one outbox row: decoded from a pgoutput Insert message
// (package replication), or read by the poller (package poll).
//
// All byte slices and strings are owned by the Event: they never alias the
// buffer of the replication connection, so an Event may outlive the message
// it was decoded from.
type Event struct {
	// ID is the outbox row's id when the id column is an integer; 0 when it
	// is a uuid (see UUID).
	ID int64
	// UUID is the text form of a uuid id column; empty for an integer id.
	UUID string
	// IDIsLSN says ID is the LSN of an outbox_emit message, not a row's
	// id: it is unique too, but never an id of the table's sequence (the
	// checkpoint's highest id, which a reset moves the sequence past,
	// leaves it out).
	IDIsLSN bool
	// AggregateID becomes the Kafka record key.
	AggregateID string
	// Topic is the row's topic; empty when the column is absent or NULL.
	Topic string
	// Payload is the stored value exactly: jsonb/json/text as their text form,
	// bytea as raw bytes; nil only for a NULL payload read with
	// replication.DecoderConfig.NullPayload (never nil otherwise, even when empty).
	Payload []byte
	// EventType is the optional event type column; empty when absent or NULL.
	EventType string
	// CreatedAt is the row's creation time; zero when absent or NULL.
	CreatedAt time.Time
	// Headers are the row's own headers: its header columns, then the
	// members of its headers column, in that order.
	Headers []Header
}

// IDString is the event id as text: the uuid, or the integer in decimal.
func (e *Event) IDString() string {
	if e.UUID != "" {
		return e.UUID
	}
	return strconv.FormatInt(e.ID, 10)
}

// AppendID appends the event id as text to b.
func (e *Event) AppendID(b []byte) []byte {
	if e.UUID != "" {
		return append(b, e.UUID...)
	}
	return strconv.AppendInt(b, e.ID, 10)
}

// Header is one header an outbox row asks for.
type Header struct {
	Key, Value string
}

// EventOverhead is what an event costs beyond its bytes: the decoded
// Message and, downstream, the record, its header structs and the Kafka
// batch's record (measured: see README "Memory"). It is charged to the
// budget with every event, so that small events are bounded by bytes too.
const EventOverhead = 512

// Size is what ev costs the budget: its variable bytes plus EventOverhead.
func (e *Event) Size() int64 {
	n := len(e.UUID) + len(e.AggregateID) + len(e.Topic) + len(e.Payload) + len(e.EventType)
	for _, h := range e.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n) + EventOverhead
}
