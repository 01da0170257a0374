package format

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
)

// Decoder reads what an Encoder (or a Confluent serializer) wrote: the
// wire format's schema id, the schema from the registry (cached by id),
// the body decoded with it. Safe for concurrent use.
type Decoder struct {
	sc *schemas // nil: no registry
}

// NewDecoder returns a decoder; reg may be nil for formats without a
// registry (raw, json). One registry client can serve an Encoder and a
// Decoder alike.
func NewDecoder(reg Registry) *Decoder {
	d := &Decoder{}
	if reg != nil {
		d.sc = newSchemas(reg, time.Hour) // ids never change meaning: only byID is used
	}
	return d
}

// Value is a decoded key or value.
type Value struct {
	Format   Format
	SchemaID int   // 0: no registry format
	Index    []int // Protobuf's message index
	// Body is the bytes after the wire format's header (the whole value
	// without a registry format).
	Body []byte
	// Schema is the registry's schema of SchemaID (its text and type).
	Schema sr.Schema
	// Decoded is the value: for Avro hamba/avro's generic form (records
	// and maps as map[string]any, a union as its value or a one-entry map
	// naming its branch, timestamps as time.Time, decimals as *big.Rat);
	// for JSON and JSON Schema encoding/json's with numbers as
	// json.Number; for Protobuf a *dynamicpb.Message.
	Decoded any
}

// ErrUndecodable is matched by errors of values that cannot be decoded
// whatever is retried (not the wire format, or a body that does not
// decode with its schema): permanent, unlike a registry that does not
// answer (a *RegistryError).
var ErrUndecodable = errors.New("undecodable value")

type undecodable struct{ err error }

func (e *undecodable) Error() string        { return e.err.Error() }
func (e *undecodable) Unwrap() error        { return e.err }
func (e *undecodable) Is(target error) bool { return target == ErrUndecodable }

// Decode decodes b, written in format f.
func (d *Decoder) Decode(ctx context.Context, f Format, b []byte) (Value, error) {
	v := Value{Format: f, Body: b}
	switch f {
	case Raw, String:
		v.Decoded = b
		return v, nil
	case JSON:
		x, err := parseJSON(b)
		if err != nil {
			return v, &undecodable{err}
		}
		v.Decoded = x
		return v, nil
	}
	if d.sc == nil {
		return v, fmt.Errorf("format: decoding %s needs a schema registry", f)
	}
	var h sr.ConfluentHeader
	id, body, err := h.DecodeID(b)
	if err != nil {
		return v, &undecodable{fmt.Errorf("not the Schema Registry wire format: %w", err)}
	}
	v.SchemaID, v.Body = id, body
	if f == Protobuf {
		if v.Index, v.Body, err = h.DecodeIndex(body, 32); err != nil {
			return v, &undecodable{fmt.Errorf("protobuf message index: %w", err)}
		}
	}
	c, err := d.sc.forID(ctx, f, "", id, "")
	if err != nil {
		return v, err
	}
	if ws, ok := c.(withSchema); ok {
		v.Schema = ws.schema
	}
	if v.Decoded, err = c.decode(v.Body, v.Index); err != nil {
		return v, &undecodable{fmt.Errorf("%s schema id %d: %w", f, id, err)}
	}
	return v, nil
}

// CloudEvent is a record's CloudEvents attributes, from either mode.
type CloudEvent struct {
	Mode            CloudEvents
	SpecVersion     string
	ID, Source      string
	Type, Time      string
	DataContentType string
	DataSchema      string
	// Data is the event's data: the record's value in binary mode, the
	// data (or data_base64) member in structured mode.
	Data []byte
}

// Header is one record header (the consumer's, Kafka's).
type Header struct {
	Key   string
	Value []byte
}

// ReadCloudEvent reads the CloudEvents attributes of a record: structured
// when content-type is application/cloudevents+json, binary when it has a
// ce_specversion header. ok is false for a record that is neither. A
// record carrying content-type or a ce_* header twice is undecodable.
func ReadCloudEvent(headers []Header, value []byte) (ev CloudEvent, ok bool, err error) {
	get := func(k string) (string, bool) {
		for _, h := range headers {
			if h.Key == k {
				return string(h.Value), true
			}
		}
		return "", false
	}
	// outboxd sets each attribute header once and refuses an event whose
	// writer set one: a second one is not outboxd's, and which is cannot
	// be told.
	dup := func() error {
		for i, h := range headers {
			if h.Key != "content-type" && !strings.HasPrefix(h.Key, HeaderPrefix) {
				continue
			}
			for _, later := range headers[i+1:] {
				if later.Key == h.Key {
					return &undecodable{fmt.Errorf("CloudEvent: header %q occurs more than once", h.Key)}
				}
			}
		}
		return nil
	}
	if ct, _ := get("content-type"); strings.HasPrefix(ct, "application/cloudevents+json") {
		if err := dup(); err != nil {
			return ev, true, err
		}
		var s structuredEvent
		if err := json.Unmarshal(value, &s); err != nil {
			return ev, true, &undecodable{fmt.Errorf("structured CloudEvent: %w", err)}
		}
		ev = CloudEvent{Mode: Structured, SpecVersion: s.SpecVersion, ID: s.ID, Source: s.Source, Type: s.Type,
			Time: s.Time, DataContentType: s.DataContentType, Data: s.Data}
		if s.DataBase64 != nil {
			ev.Data = s.DataBase64
		}
		return ev, true, nil
	}
	sv, ok := get("ce_specversion")
	if !ok {
		return ev, false, nil
	}
	if err := dup(); err != nil {
		return ev, true, err
	}
	ev = CloudEvent{Mode: Binary, SpecVersion: sv, Data: value}
	ev.ID, _ = get("ce_id")
	ev.Source, _ = get("ce_source")
	ev.Type, _ = get("ce_type")
	ev.Time, _ = get("ce_time")
	ev.DataSchema, _ = get("ce_dataschema")
	ev.DataContentType, _ = get("content-type")
	return ev, true, nil
}
