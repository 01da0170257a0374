package format

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/outboxd/outboxd/kafka"
)

// CloudEvents Kafka protocol binding, version 1.0.
const (
	specVersion           = "1.0"
	contentTypeStructured = "application/cloudevents+json; charset=UTF-8"
	// HeaderPrefix starts every binary-mode attribute header.
	HeaderPrefix = "ce_"
)

// attributes are the CloudEvents attributes of a record: id = the event
// id (the id header outboxd set, else the record's ids), source = the
// configured source, type = the event type (the event-type header; the
// topic when the row has none), time = the record's timestamp (the
// row's created_at, else the commit time).
func (e *Encoder) attributes(r *kafka.Record) (id, source, typ, ts string) {
	id = headerValue(r.Headers, or(e.cfg.IDHeader, defaultIDHeader))
	if id == "" {
		id = r.EventID
	}
	if id == "" {
		id = strconv.FormatInt(r.OutboxID, 10)
	}
	typ = headerValue(r.Headers, or(e.cfg.TypeHeader, defaultTypeHeader))
	if typ == "" {
		typ = r.Topic
	}
	return id, e.cfg.Source, typ, r.Timestamp.UTC().Format(time.RFC3339Nano)
}

// binaryHeaders appends the binary mode's headers to hs.
func (e *Encoder) binaryHeaders(r *kafka.Record, hs []kafka.Header) []kafka.Header {
	id, source, typ, ts := e.attributes(r)
	return append(hs,
		kafka.Header{Key: "ce_specversion", Value: []byte(specVersion)},
		kafka.Header{Key: "ce_id", Value: []byte(id)},
		kafka.Header{Key: "ce_source", Value: []byte(source)},
		kafka.Header{Key: "ce_type", Value: []byte(typ)},
		kafka.Header{Key: "ce_time", Value: []byte(ts)},
		kafka.Header{Key: "content-type", Value: []byte(e.contentType(r.Value))},
	)
}

// contentType is the value's media type: its format's, or, for a raw
// payload that is not JSON (a bytea column), application/octet-stream.
func (e *Encoder) contentType(value []byte) string {
	if e.cfg.Value.Format == Raw && value != nil && !json.Valid(value) {
		return "application/octet-stream"
	}
	return e.cfg.Value.Format.ContentType()
}

// structuredEvent is the JSON event format's shape (CloudEvents' JSON
// format, version 1.0).
type structuredEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data,omitempty"`
	DataBase64      []byte          `json:"data_base64,omitempty"`
}

// structured is the structured mode's value: a JSON payload as data, a
// registry format's bytes (or a raw payload that is not JSON) as
// data_base64.
func (e *Encoder) structured(r *kafka.Record, value []byte) ([]byte, error) {
	id, source, typ, ts := e.attributes(r)
	ev := structuredEvent{SpecVersion: specVersion, ID: id, Source: source, Type: typ, Time: ts,
		DataContentType: e.cfg.Value.Format.ContentType()}
	switch {
	case !e.cfg.Value.Format.registry() && json.Valid(value):
		ev.Data = value
	case e.cfg.Value.Format == Raw:
		ev.DataContentType = "application/octet-stream"
		ev.DataBase64 = value
	default:
		ev.DataBase64 = value
	}
	return json.Marshal(&ev)
}
