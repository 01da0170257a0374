package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/IBM/sarama"
)

// The dead-letter header vocabulary, one for the whole project: added after
// the original headers by outboxd's publisher (a record Kafka refused for
// good) and by the consumer package (a message its handler gave up on).
const (
	HeaderDLQError           = "dlq-error"            // the error text
	HeaderDLQErrorClass      = "dlq-error-class"      // poison (publisher); domain or transient (consumer)
	HeaderDLQSourceTopic     = "dlq-source-topic"     // the topic the record was for, or read from
	HeaderDLQSourcePartition = "dlq-source-partition" // consumer: decimal
	HeaderDLQSourceOffset    = "dlq-source-offset"    // consumer: decimal
	HeaderDLQAttempts        = "dlq-attempts"         // consumer: handler attempts, decimal
	HeaderDLQConsumerGroup   = "dlq-consumer-group"   // consumer: the group that gave up
	HeaderDLQPayloadBytes    = "dlq-payload-bytes"    // publisher: the value's size, decimal
	HeaderDLQPayloadOmitted  = "dlq-payload-omitted"  // publisher: "true" when the value was left out
	HeaderDLQSourceLSN       = "dlq-source-lsn"       // publisher, a bad event: its change's LSN (0/16B3748)
	HeaderDLQSourceXid       = "dlq-source-xid"       // publisher, a bad event: its transaction id, decimal
	HeaderDLQSourceTable     = "dlq-source-table"     // publisher, a bad event: schema.table
	HeaderDLQEventID         = "dlq-event-id"         // publisher, a bad event: its id when it could be read
)

// ClassPoison is the publisher's dead-letter error class.
const ClassPoison = "poison"

// The publisher's dead-letter header names before 0.2, still written
// beside the new ones for one release so that tools reading them keep
// working; they go in the release after.
const (
	legacyHeaderError         = "outboxd-error"
	legacyHeaderOriginalTopic = "outboxd-original-topic"
	legacyHeaderPayloadBytes  = "outboxd-payload-bytes"
	legacyHeaderPayloadOmit   = "outboxd-payload-omitted"
)

// DeadLetterer sends poison records to the dead-letter topic, one at a
// time, each waited for, with the package's own Producer. sarama's
// SyncProducer, used before, takes no context: a DeadLetter called while
// Kafka was away waited out sarama's retries whatever its caller's
// context said, and so did the shutdown that cancelled it. The Producer's
// Send and Close end on the context and at once, and its delivery timeout
// bounds a dead letter as it does every other record.
type DeadLetterer struct {
	topic string
	p     *Producer
}

// NewDeadLetterer connects a producer for topic. Dead letters are not part
// of a transaction, and one the dead-letter topic refuses for good does
// not stop those after it (each is its caller's error).
func NewDeadLetterer(cfg Config, topic string) (*DeadLetterer, error) {
	cfg.TransactionalID = ""
	cfg.ContinueAfterPoison = true
	p, err := NewProducer(cfg, nil, ProducerHooks{})
	if err != nil {
		return nil, fmt.Errorf("kafka dead-letter producer: %w", err)
	}
	return &DeadLetterer{topic: topic, p: p}, nil
}

// DeadLetter implements DeadLetterer. The original key, value and headers are
// kept; a value that made the record too large is omitted (it stays in the
// outbox table) and its size is noted in a header. It returns ctx's error
// as soon as ctx ends; the record may still be delivered after that (it is
// the producer's until it comes back, and Close ends that).
func (d *DeadLetterer) DeadLetter(ctx context.Context, r *Record, cause error) error {
	text, size := []byte(cause.Error()), strconv.AppendInt(nil, int64(len(r.Value)), 10)
	headers := make([]Header, 0, len(r.Headers)+9)
	headers = append(headers, r.Headers...)
	headers = append(headers,
		Header{Key: HeaderDLQError, Value: text},
		Header{Key: HeaderDLQErrorClass, Value: []byte(ClassPoison)},
		Header{Key: HeaderDLQSourceTopic, Value: []byte(r.Topic)},
		Header{Key: HeaderDLQPayloadBytes, Value: size},
		Header{Key: legacyHeaderError, Value: text},
		Header{Key: legacyHeaderOriginalTopic, Value: []byte(r.Topic)},
		Header{Key: legacyHeaderPayloadBytes, Value: size},
	)
	// Done has room for the one answer, so the producer never blocks on
	// it, even when the caller gave up before the answer came.
	done := make(chan *Record, 1)
	m := &Record{Topic: d.topic, Key: r.Key, Value: r.Value, Headers: headers, Timestamp: r.Timestamp,
		OutboxID: r.OutboxID, EventID: r.EventID, Urgent: true, Done: done}
	var ce sarama.ConfigurationError
	if r.Size()+1024 > d.p.cfg.MaxMessageBytes || errors.As(cause, &ce) ||
		errors.Is(cause, sarama.ErrMessageSizeTooLarge) || errors.Is(cause, sarama.ErrMessageSetSizeTooLarge) {
		m.Value = nil
		m.Headers = append(m.Headers,
			Header{Key: HeaderDLQPayloadOmitted, Value: []byte("true")},
			Header{Key: legacyHeaderPayloadOmit, Value: []byte("true")})
	}
	if err := d.p.Send(ctx, m); err != nil {
		return err
	}
	select {
	case back := <-done:
		var pe *PoisonError
		if errors.As(back.Err, &pe) {
			// The dead-letter topic's refusal is not the event's poison:
			// matching ErrPoison would read as "set a dead-letter topic".
			return fmt.Errorf("dead-letter topic %q refused the record: %w", d.topic, pe.Err)
		}
		return back.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the producer: a dead letter still out fails at once.
func (d *DeadLetterer) Close() error { return d.p.Close() }
