package outbox

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxd/outboxd/kafka"
)

// kafka.Header names set on every record by default.
const (
	HeaderOutboxID    = "outbox-id"
	HeaderAggregateID = "aggregate-id"
	HeaderEventType   = "event-type"
)

// Encoding is how a key or value travels to Kafka.
type Encoding string

const (
	// Raw sends the column's bytes as stored (text as UTF-8, bytea as is).
	Raw Encoding = "raw"
	// JSONString sends the column's text as a JSON string, quoted and
	// escaped: what Kafka Connect's JsonConverter with schemas.enable=false
	// writes for a string field, and so what consumers of Debezium's Outbox
	// Event Router read by default.
	JSONString Encoding = "json-string"
)

// Mapping says how an outbox event becomes a Kafka record, beyond what the
// decoder already took from the row (topic, key, payload, timestamp, the
// row's own headers). Start from DefaultMapping.
type Mapping struct {
	// DefaultTopic is used for rows without a topic (no topic column, a
	// NULL one, or a NULL placeholder of the topic template).
	DefaultTopic string
	// IDHeader names the header carrying the event id as text ("" is
	// outbox-id; "-" sets none).
	IDHeader string
	// KeyHeader names the header carrying the key, the aggregate id (""
	// is aggregate-id; "-" sets none).
	KeyHeader string
	// KeyEncoding and ValueEncoding encode the key and the payload ("" is
	// Raw).
	KeyEncoding, ValueEncoding Encoding
}

// DefaultMapping returns outboxd's own record shape: headers outbox-id and
// aggregate-id, key and value raw.
func DefaultMapping() Mapping {
	return Mapping{IDHeader: HeaderOutboxID, KeyHeader: HeaderAggregateID, KeyEncoding: Raw, ValueEncoding: Raw}
}

// Validate reports an unknown encoding.
func (m Mapping) Validate() error {
	for _, e := range []struct {
		what string
		enc  Encoding
	}{{"key encoding", m.KeyEncoding}, {"value encoding", m.ValueEncoding}} {
		switch e.enc {
		case "", Raw, JSONString:
		default:
			return fmt.Errorf("%s %q is unknown: use %q or %q", e.what, e.enc, Raw, JSONString)
		}
	}
	return nil
}

// NewRecord maps an outbox event to a record: topic from the row (or the
// default), key = aggregate id, value = payload (each as its encoding says),
// headers: the id header, the key header, event-type (when the row has one)
// and the row's own headers, in that order; timestamp = the row's (or the
// commit time when the row has none).
func NewRecord(ev *Event, m *Mapping, commitTime time.Time) *kafka.Record {
	topic := ev.Topic
	if topic == "" {
		topic = m.DefaultTopic
	}
	// Room for the id, key and event-type headers, the row's, and the
	// origin header the pipeline adds (no second allocation per event).
	hs := make([]kafka.Header, 0, 4+len(ev.Headers))
	if h := or(m.IDHeader, HeaderOutboxID); h != noHeader {
		hs = append(hs, kafka.Header{Key: h, Value: ev.AppendID(nil)})
	}
	if h := or(m.KeyHeader, HeaderAggregateID); h != noHeader {
		hs = append(hs, kafka.Header{Key: h, Value: []byte(ev.AggregateID)})
	}
	if ev.EventType != "" {
		hs = append(hs, kafka.Header{Key: HeaderEventType, Value: []byte(ev.EventType)})
	}
	for _, h := range ev.Headers {
		hs = append(hs, kafka.Header{Key: h.Key, Value: []byte(h.Value)})
	}
	ts := ev.CreatedAt
	if ts.IsZero() {
		ts = commitTime
	}
	key, value := []byte(ev.AggregateID), ev.Payload
	if m.KeyEncoding == JSONString {
		key = appendJSONString(make([]byte, 0, len(key)+2), key)
	}
	if m.ValueEncoding == JSONString && value != nil { // nil: a tombstone stays null
		// A bytea payload is escaped as if it were text (JsonConverter
		// would write base64): keep bytea payloads raw.
		value = appendJSONString(make([]byte, 0, len(value)+len(value)/8+2), value)
	}
	return &kafka.Record{
		Topic:     topic,
		Key:       key,
		Value:     value,
		Headers:   hs,
		Timestamp: ts,
		OutboxID:  ev.ID,
		EventID:   ev.UUID,
	}
}

// SendsOrigin reports whether records of mapping m carry the origin header:
// only in outboxd's own shape (id in outbox-id, which package consumer
// reads), not in another tool's (Debezium's headers are exactly its own).
func (m *Mapping) SendsOrigin() bool { return m.IDHeader == "" || m.IDHeader == HeaderOutboxID }

// HeaderOrigin names the header that says which history of which database
// an event comes from (Identity.Origin): consumers deduplicate on origin
// and id.
const HeaderOrigin = "outbox-origin"

// noHeader, as a header name of Mapping, sets no header.
const noHeader = "-"

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

const hexDigits = "0123456789ABCDEF"

// appendJSONString appends s as a JSON string the way Jackson (and so Kafka
// Connect's JsonConverter) writes it: '"' and '\\' escaped, control
// characters as \b \t \n \f \r or \u00XX, everything else (non-ASCII
// included) as is; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b, s []byte) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, "\uFFFD"...)
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return append(b, '"')
}
