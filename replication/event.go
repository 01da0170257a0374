package replication

import (
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/outbox"
)

// Event is one outbox row (outbox.Event): the decoder makes it from a
// pgoutput Insert message, the poller from a SELECT.
type Event = outbox.Event

// Header is one header an outbox row asks for (outbox.Header).
type Header = outbox.Header

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
	// KindBad is an outbox row, or an authentic outbox_emit message, that
	// cannot become a record (Message.Bad).
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
