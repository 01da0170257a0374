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

// DeadLetterer sends poison records to the dead-letter topic with a
// synchronous producer.
type DeadLetterer struct {
	topic    string
	maxBytes int
	sp       sarama.SyncProducer
}

// NewDeadLetterer connects a synchronous producer for topic.
func NewDeadLetterer(cfg Config, topic string) (*DeadLetterer, error) {
	sc, err := cfg.Sarama()
	if err != nil {
		return nil, err
	}
	sp, err := sarama.NewSyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka dead-letter producer: %w", err)
	}
	return &DeadLetterer{topic: topic, maxBytes: cfg.MaxMessageBytes, sp: sp}, nil
}

// DeadLetter implements DeadLetterer. The original key, value and headers are
// kept; a value that made the record too large is omitted (it stays in the
// outbox table) and its size is noted in a header.
func (d *DeadLetterer) DeadLetter(_ context.Context, r *Record, cause error) error {
	text, size := []byte(cause.Error()), strconv.AppendInt(nil, int64(len(r.Value)), 10)
	m := saramaMessage(d.topic, r,
		sarama.RecordHeader{Key: []byte(HeaderDLQError), Value: text},
		sarama.RecordHeader{Key: []byte(HeaderDLQErrorClass), Value: []byte(ClassPoison)},
		sarama.RecordHeader{Key: []byte(HeaderDLQSourceTopic), Value: []byte(r.Topic)},
		sarama.RecordHeader{Key: []byte(HeaderDLQPayloadBytes), Value: size},
		sarama.RecordHeader{Key: []byte(legacyHeaderError), Value: text},
		sarama.RecordHeader{Key: []byte(legacyHeaderOriginalTopic), Value: []byte(r.Topic)},
		sarama.RecordHeader{Key: []byte(legacyHeaderPayloadBytes), Value: size},
	)
	var ce sarama.ConfigurationError
	if r.Size()+1024 > d.maxBytes || errors.As(cause, &ce) ||
		errors.Is(cause, sarama.ErrMessageSizeTooLarge) || errors.Is(cause, sarama.ErrMessageSetSizeTooLarge) {
		m.Value = nil
		m.Headers = append(m.Headers,
			sarama.RecordHeader{Key: []byte(HeaderDLQPayloadOmitted), Value: []byte("true")},
			sarama.RecordHeader{Key: []byte(legacyHeaderPayloadOmit), Value: []byte("true")})
	}
	_, _, err := d.sp.SendMessage(m)
	return err
}

// Close closes the producer.
func (d *DeadLetterer) Close() error { return d.sp.Close() }
