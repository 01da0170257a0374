package publisher

import (
	"strconv"
	"time"

	"github.com/outboxd/outboxd/replication"
)

// Header names set on every record.
const (
	HeaderOutboxID    = "outbox-id"
	HeaderAggregateID = "aggregate-id"
	HeaderEventType   = "event-type"
)

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one event on its way to Kafka and back. A Producer returns every
// record it was given exactly once on Results, with Err set on failure.
type Record struct {
	Topic     string
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time

	OutboxID int64
	// Set by the producer on return.
	Partition int32
	Offset    int64
	Err       error

	txn      *txn
	size     int64
	enqueued time.Time // when the producer queued it, for the linger
}

// Size is the record's key, value and header bytes.
func (r *Record) Size() int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// NewRecord maps an outbox event to a record: topic from the row (or the
// default), key = aggregate id, value = payload as stored, headers outbox-id,
// aggregate-id and event-type (when the row has one), timestamp = created_at
// (or the commit time when the row has none).
func NewRecord(ev *replication.Event, defaultTopic string, commitTime time.Time) *Record {
	topic := ev.Topic
	if topic == "" {
		topic = defaultTopic
	}
	n := 2
	if ev.EventType != "" {
		n++
	}
	hs := make([]Header, 0, n)
	hs = append(hs,
		Header{Key: HeaderOutboxID, Value: strconv.AppendInt(nil, ev.ID, 10)},
		Header{Key: HeaderAggregateID, Value: []byte(ev.AggregateID)},
	)
	if ev.EventType != "" {
		hs = append(hs, Header{Key: HeaderEventType, Value: []byte(ev.EventType)})
	}
	ts := ev.CreatedAt
	if ts.IsZero() {
		ts = commitTime
	}
	r := &Record{
		Topic:     topic,
		Key:       []byte(ev.AggregateID),
		Value:     ev.Payload,
		Headers:   hs,
		Timestamp: ts,
		OutboxID:  ev.ID,
	}
	r.size = int64(r.Size())
	return r
}
