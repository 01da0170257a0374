package publisher

import (
	"strconv"
	"time"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// kafka.Header names set on every record.
const (
	HeaderOutboxID    = "outbox-id"
	HeaderAggregateID = "aggregate-id"
	HeaderEventType   = "event-type"
)

// NewRecord maps an outbox event to a record: topic from the row (or the
// default), key = aggregate id, value = payload as stored, headers outbox-id,
// aggregate-id and event-type (when the row has one), timestamp = created_at
// (or the commit time when the row has none).
func NewRecord(ev *replication.Event, defaultTopic string, commitTime time.Time) *kafka.Record {
	topic := ev.Topic
	if topic == "" {
		topic = defaultTopic
	}
	n := 2
	if ev.EventType != "" {
		n++
	}
	hs := make([]kafka.Header, 0, n)
	hs = append(hs,
		kafka.Header{Key: HeaderOutboxID, Value: strconv.AppendInt(nil, ev.ID, 10)},
		kafka.Header{Key: HeaderAggregateID, Value: []byte(ev.AggregateID)},
	)
	if ev.EventType != "" {
		hs = append(hs, kafka.Header{Key: HeaderEventType, Value: []byte(ev.EventType)})
	}
	ts := ev.CreatedAt
	if ts.IsZero() {
		ts = commitTime
	}
	r := &kafka.Record{
		Topic:     topic,
		Key:       []byte(ev.AggregateID),
		Value:     ev.Payload,
		Headers:   hs,
		Timestamp: ts,
		OutboxID:  ev.ID,
	}
	return r
}
