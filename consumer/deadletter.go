package consumer

import (
	"strconv"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/kafka"
)

// Headers added to a dead-letter record, after the original ones: the
// project's one dead-letter vocabulary (package kafka), shared with
// outboxd's publisher.
const (
	HeaderError           = kafka.HeaderDLQError           // the error text
	HeaderErrorClass      = kafka.HeaderDLQErrorClass      // ClassDomain or ClassTransient
	HeaderSourceTopic     = kafka.HeaderDLQSourceTopic     // where the message was read
	HeaderSourcePartition = kafka.HeaderDLQSourcePartition // decimal
	HeaderSourceOffset    = kafka.HeaderDLQSourceOffset    // decimal
	HeaderAttempts        = kafka.HeaderDLQAttempts        // handler attempts, decimal
	HeaderConsumerGroup   = kafka.HeaderDLQConsumerGroup   // the group that gave up
)

// maxErrorHeader bounds the error text in a dead-letter record.
const maxErrorHeader = 4096

// Producer sends one record and waits for its acknowledgement.
// sarama.SyncProducer satisfies it.
type Producer interface {
	SendMessage(msg *sarama.ProducerMessage) (partition int32, offset int64, err error)
}

// deadLetterRecord builds the dead-letter record of m: original key, value
// and headers (minus any dlq-* headers of an earlier dead-lettering, which
// would be ambiguous) plus the error headers.
func deadLetterRecord(topic, group string, m *Message, cause error, class string, attempts int) *sarama.ProducerMessage {
	pm := &sarama.ProducerMessage{Topic: topic}
	if m.Key != nil {
		pm.Key = sarama.ByteEncoder(m.Key)
	}
	if m.Value != nil {
		pm.Value = sarama.ByteEncoder(m.Value)
	}
	ours := map[string]bool{
		HeaderError: true, HeaderErrorClass: true, HeaderSourceTopic: true, HeaderSourcePartition: true,
		HeaderSourceOffset: true, HeaderAttempts: true, HeaderConsumerGroup: true,
	}
	pm.Headers = make([]sarama.RecordHeader, 0, len(m.Headers)+len(ours))
	for _, h := range m.Headers {
		if !ours[h.Key] {
			pm.Headers = append(pm.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
	}
	text := cause.Error()
	if len(text) > maxErrorHeader {
		text = text[:maxErrorHeader-3] + "..."
	}
	pm.Headers = append(pm.Headers,
		sarama.RecordHeader{Key: []byte(HeaderError), Value: []byte(text)},
		sarama.RecordHeader{Key: []byte(HeaderErrorClass), Value: []byte(class)},
		sarama.RecordHeader{Key: []byte(HeaderSourceTopic), Value: []byte(m.Topic)},
		sarama.RecordHeader{Key: []byte(HeaderSourcePartition), Value: strconv.AppendInt(nil, int64(m.Partition), 10)},
		sarama.RecordHeader{Key: []byte(HeaderSourceOffset), Value: strconv.AppendInt(nil, m.Offset, 10)},
		sarama.RecordHeader{Key: []byte(HeaderAttempts), Value: strconv.AppendInt(nil, int64(attempts), 10)},
		sarama.RecordHeader{Key: []byte(HeaderConsumerGroup), Value: []byte(group)},
	)
	return pm
}
