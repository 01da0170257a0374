package format

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
)

// Header names outboxd sets that the encoder reads (the publisher's
// defaults; Config.IDHeader and TypeHeader name others).
const (
	defaultIDHeader   = "outbox-id"
	defaultTypeHeader = "event-type"
)

// Encoder rewrites records built from outbox events into the configured
// formats. Encode is safe for concurrent use.
type Encoder struct {
	cfg Config
	sc  *schemas // nil: no registry format
	log *zap.Logger
	m   *metrics
}

// NewEncoder checks cfg and builds an encoder. reg may be nil when no
// registry format is configured.
func NewEncoder(cfg Config, reg Registry, log *zap.Logger, r prometheus.Registerer) (*Encoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Encoder{cfg: cfg, log: log, m: newMetrics(r)}
	if cfg.NeedsRegistry() {
		if reg == nil {
			return nil, errors.New("format: avro, protobuf and json-schema need a schema registry (--schema-registry-url)")
		}
		e.sc = newSchemas(reg, cfg.cacheTTL())
	}
	return e, nil
}

// Encode rewrites r, whose value is the event's payload and key its
// aggregate id, in the configured formats: the key and value in their
// formats (a null value, a tombstone, stays null), then the CloudEvents
// attributes. A payload or key that does not fit is a *BadPayloadError
// (a poison event); a registry that cannot tell the schema, a
// *RegistryError. On error r is unchanged.
func (e *Encoder) Encode(ctx context.Context, r *kafka.Record) error {
	value, key := r.Value, r.Key
	if r.Value != nil && e.cfg.Value.Format != Raw {
		v, err := e.encodeSide(ctx, r, e.cfg.Value, "value", r.Value)
		if err != nil {
			e.m.failed(e.cfg.Value.Format, err)
			return err
		}
		value = v
	}
	if f := e.cfg.Key.Format; f != Raw && f != String {
		k, err := e.encodeSide(ctx, r, e.cfg.Key, "key", keyJSON(r.Key))
		if err != nil {
			e.m.failed(f, err)
			return err
		}
		key = k
	}
	switch e.cfg.CloudEvents {
	case Binary:
		r.Headers = e.binaryHeaders(r, r.Headers)
	case Structured:
		if value == nil { // a tombstone stays null: its attributes go in headers
			r.Headers = e.binaryHeaders(r, r.Headers)
			break
		}
		v, err := e.structured(r, value)
		if err != nil {
			e.m.failed(e.cfg.Value.Format, err)
			return err
		}
		value = v
		r.Headers = append(r.Headers, kafka.Header{Key: "content-type", Value: []byte(contentTypeStructured)})
	}
	r.Value, r.Key = value, key
	e.m.encoded.WithLabelValues(string(e.cfg.Value.Format)).Inc()
	return nil
}

// encodeSide writes payload (JSON) in side's format.
func (e *Encoder) encodeSide(ctx context.Context, r *kafka.Record, side Side, which string, payload []byte) ([]byte, error) {
	if side.Format == JSON {
		if !json.Valid(payload) {
			return nil, &BadPayloadError{Format: JSON, Reason: "not JSON"}
		}
		return payload, nil
	}
	var (
		id      int
		c       codec
		subject string
		err     error
	)
	if side.SchemaID != 0 { // pinned: no subject is looked up
		id = side.SchemaID
		c, err = e.sc.forID(ctx, side.Format, side.Message, id, "")
	} else if subject, err = e.subject(r, which); err == nil {
		id, c, err = e.sc.forSubject(ctx, side.Format, side, subject, e.cfg.AutoRegister)
	}
	if err != nil {
		return nil, err
	}
	var h sr.ConfluentHeader
	out, err := h.AppendEncode(make([]byte, 0, len(payload)+16), id, c.index())
	if err != nil {
		return nil, err
	}
	out, err = c.encode(out, payload)
	if err != nil {
		return nil, &BadPayloadError{Format: side.Format, Subject: subject, ID: id, Reason: err.Error()}
	}
	return out, nil
}

// subject names the record's subject as the strategy says.
func (e *Encoder) subject(r *kafka.Record, which string) (string, error) {
	switch e.cfg.Strategy {
	case RecordName, TopicRecordName:
		name := headerValue(r.Headers, or(e.cfg.TypeHeader, defaultTypeHeader))
		if name == "" {
			return "", &BadPayloadError{Format: e.cfg.Value.Format, Reason: "the record name strategy names the subject after the event type, and the event has none"}
		}
		if e.cfg.Strategy == RecordName {
			return name, nil
		}
		return r.Topic + "-" + name, nil
	}
	return r.Topic + "-" + which, nil
}

// keyJSON is the key as the JSON its schema is applied to: the aggregate
// id when it is a JSON object, else the id as a JSON string.
func keyJSON(k []byte) []byte {
	if len(k) > 0 && k[0] == '{' && json.Valid(k) {
		return k
	}
	b, _ := json.Marshal(string(k)) // a string always marshals
	return b
}

func headerValue(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// metrics count what the encoder did.
type metrics struct {
	encoded *prometheus.CounterVec
	errors  *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer) *metrics {
	m := &metrics{
		encoded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_format_encoded_total",
			Help: "Records written in a --value-format or --cloudevents format, by value format.",
		}, []string{"format"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outboxd_format_errors_total",
			Help: "Records that could not be encoded, by value format and kind (bad_payload: the event's fault, dead-lettered or halting; registry: the registry did not tell the schema, restarting).",
		}, []string{"format", "kind"}),
	}
	if r != nil {
		r.MustRegister(m.encoded, m.errors)
	}
	return m
}

func (m *metrics) failed(f Format, err error) {
	kind := "registry"
	var bad *BadPayloadError
	if errors.As(err, &bad) {
		kind = "bad_payload"
	}
	m.errors.WithLabelValues(string(f), kind).Inc()
}
