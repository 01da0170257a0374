package replication

import (
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// Event is one outbox row, decoded from a pgoutput Insert message.
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
	// AggregateID becomes the Kafka record key.
	AggregateID string
	// Topic is the row's topic; empty when the column is absent or NULL.
	Topic string
	// Payload is the stored value exactly: jsonb/json/text as their text form,
	// bytea as raw bytes; nil only for a NULL payload read with
	// DecoderConfig.NullPayload (never nil otherwise, even when empty).
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

// Begin marks the start of a committed transaction.
type Begin struct {
	Xid uint32
	// FinalLSN is the LSN of the transaction's commit record.
	FinalLSN   pglogrepl.LSN
	CommitTime time.Time
	// Received is when the Stream read the Begin off the connection (zero
	// from the Decoder alone): Received − CommitTime is the PostgreSQL side
	// of the latency (the walsender's decoding and sending, the network),
	// before anything in outboxd could be slow.
	Received time.Time
}

// Commit marks the end of a transaction. EndLSN (the position just past the
// commit record) is what may be confirmed to the server once every event of
// the transaction is durable downstream; never CommitLSN.
type Commit struct {
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN
	CommitTime time.Time
}

// Kind says which field of a Message is set.
type Kind uint8

const (
	// KindNone is a message that means nothing for the outbox (a Relation,
	// an Update, a row of another table, ...).
	KindNone Kind = iota
	KindBegin
	KindEvent
	KindCommit
	// KindRejected is a message with outboxd's prefix that outbox_emit did
	// not provably write (Message.Rejected): skipped, never published.
	KindRejected
	// KindBad is an outbox row that cannot become a record (Message.Bad).
	KindBad
)

func (k Kind) String() string {
	switch k {
	case KindBegin:
		return "begin"
	case KindEvent:
		return "event"
	case KindCommit:
		return "commit"
	case KindRejected:
		return "rejected"
	case KindBad:
		return "bad"
	default:
		return "none"
	}
}

// Message is what one pgoutput message means for the outbox.
type Message struct {
	Kind   Kind
	Begin  Begin
	Event  Event
	Commit Commit
	// Rejected is set for KindRejected.
	Rejected Rejected
	// Bad is set for KindBad.
	Bad BadEvent
	// WALStart is the XLogData start position the message came with.
	WALStart pglogrepl.LSN
	// Budgeted is the room the Stream took from the consumer's Budget for
	// this event (Event.Size()); the consumer releases it. 0: none taken.
	Budgeted int64
}
