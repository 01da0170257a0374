package consumer

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// HeaderOutboxID is the header that carries the event's outbox id (the same
// name outboxd's publisher sets).
const HeaderOutboxID = "outbox-id"

// HeaderOrigin is the header that says which outbox, and which history of
// its database, an event comes from (outboxd sets it with checkpoints on:
// system id/database/generation). Events are deduplicated on origin and id;
// an event without it has origin "".
const HeaderOrigin = "outbox-origin"

// Handler processes one event. It runs inside tx, the transaction that also
// records the outbox id as processed; it must do its writes through tx and
// must not commit or roll it back. Returning an error rolls everything back:
// wrap permanent failures with [Domain]; any other error is retried. When
// the message has a traceparent header, ctx carries its trace context
// ([TraceContextFrom]).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, m *Message) error
}

// HandlerFunc adapts a function to [Handler].
type HandlerFunc func(ctx context.Context, tx pgx.Tx, m *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, m *Message) error { return f(ctx, tx, m) }

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Message is one Kafka record as the handler sees it.
type Message struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time

	// OutboxID is the value of the outbox-id header when it is an integer
	// (0 for a uuid id).
	OutboxID int64
	// EventID is the outbox-id header's id as text: the integer in
	// decimal, or the uuid in lower case.
	EventID string
	// Origin is the outbox-origin header ("" when it has none).
	Origin string
	// Attempt is the number of this attempt, from 1.
	Attempt int
}

// Header returns the value of the first header named key.
func (m *Message) Header(key string) ([]byte, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// headerOnce returns the value of the header named key and how many times
// the message carries it.
func (m *Message) headerOnce(key string) (v []byte, n int) {
	for _, h := range m.Headers {
		if h.Key == key {
			if n == 0 {
				v = h.Value
			}
			n++
		}
	}
	return v, n
}

// String names the message as topic/partition@offset.
func (m *Message) String() string {
	return fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
}

// newMessage copies a sarama record and parses its outbox id; err is a
// domain error wrapping ErrNoOutboxID when the header is missing or invalid,
// ErrDuplicateHeader when it or the origin header occurs more than once.
func newMessage(cm *sarama.ConsumerMessage) (*Message, error) {
	m := &Message{
		Topic:     cm.Topic,
		Partition: cm.Partition,
		Offset:    cm.Offset,
		Key:       cm.Key,
		Value:     cm.Value,
		Timestamp: cm.Timestamp,
	}
	if len(cm.Headers) > 0 {
		m.Headers = make([]Header, 0, len(cm.Headers))
		for _, h := range cm.Headers {
			if h != nil {
				m.Headers = append(m.Headers, Header{Key: string(h.Key), Value: h.Value})
			}
		}
	}
	v, n := m.headerOnce(HeaderOutboxID)
	if n == 0 {
		return m, Domain(fmt.Errorf("%w: the header is missing", ErrNoOutboxID))
	}
	o, no := m.headerOnce(HeaderOrigin)
	for _, d := range []struct {
		name string
		n    int
	}{{HeaderOutboxID, n}, {HeaderOrigin, no}} {
		if d.n > 1 {
			return m, Domain(fmt.Errorf("%w: %s occurs %d times", ErrDuplicateHeader, d.name, d.n))
		}
	}
	m.Origin = string(o)
	text := bytes.TrimSpace(v)
	if id, err := strconv.ParseInt(string(text), 10, 64); err == nil && id > 0 {
		m.OutboxID, m.EventID = id, strconv.FormatInt(id, 10)
		return m, nil
	}
	if isUUID(text) {
		m.EventID = string(bytes.ToLower(text))
		return m, nil
	}
	return m, Domain(fmt.Errorf("%w: %q", ErrNoOutboxID, v))
}

// dedupID is the id the dedup table keys on: EventID, or OutboxID in
// decimal for a message built without it.
func (m *Message) dedupID() string {
	if m.EventID != "" {
		return m.EventID
	}
	return strconv.FormatInt(m.OutboxID, 10)
}

// isUUID reports whether b is a uuid in its text form
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).
func isUUID(b []byte) bool {
	if len(b) != 36 {
		return false
	}
	for i, c := range b {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// Outcome is how a message got done.
type Outcome int

const (
	// Processed: the handler's transaction committed.
	Processed Outcome = iota + 1
	// Duplicate: the outbox id was already processed; skipped.
	Duplicate
	// DeadLettered: the dead-letter topic acknowledged the message.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case DeadLettered:
		return "dead-lettered"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Result is what happened to a message that is done.
type Result struct {
	Outcome  Outcome
	Attempts int // handler attempts (1 when it succeeded at once)

	// Set for DeadLettered.
	Err                 error  // why
	Class               string // ClassDomain or ClassTransient
	DeadLetterTopic     string
	DeadLetterPartition int32
	DeadLetterOffset    int64
}
