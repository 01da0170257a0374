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

	// OutboxID is the value of the outbox-id header (0 when it has none).
	OutboxID int64
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

// String names the message as topic/partition@offset.
func (m *Message) String() string {
	return fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
}

// newMessage copies a sarama record and parses its outbox id; err is a
// domain error wrapping ErrNoOutboxID when the header is missing or invalid.
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
	v, ok := m.Header(HeaderOutboxID)
	if !ok {
		return m, Domain(fmt.Errorf("%w: the header is missing", ErrNoOutboxID))
	}
	id, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
	if err != nil || id <= 0 {
		return m, Domain(fmt.Errorf("%w: %q", ErrNoOutboxID, v))
	}
	m.OutboxID = id
	return m, nil
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
