package consumer

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/format"
)

// Decoded is a message with its value decoded as outboxd's --value-format
// (or a Confluent serializer) wrote it, and its CloudEvents attributes.
type Decoded struct {
	*Message
	// Value is the decoded value: Value.Decoded the value itself,
	// Value.Body, Value.SchemaID and Value.Schema the raw bytes and their
	// schema. For a
	// structured CloudEvent, the event's data decoded.
	Value format.Value
	// CloudEvent is set when the message carries CloudEvents attributes
	// (binary or structured mode).
	CloudEvent *format.CloudEvent
}

// DecodedHandlerFunc processes one decoded event, as Handler does.
type DecodedHandlerFunc func(ctx context.Context, tx pgx.Tx, d *Decoded) error

// Decode returns a Handler that decodes each message's value in format f
// with dec (whose registry client an Encoder may share) before h sees it.
// A tombstone (a null value) reaches h undecoded. A value that cannot be
// decoded is a domain error (dead-lettered, not retried); a registry that
// does not answer is retried.
func Decode(dec *format.Decoder, f format.Format, h DecodedHandlerFunc) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		d := &Decoded{Message: m, Value: format.Value{Format: f}}
		data := m.Value
		hs := make([]format.Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i] = format.Header{Key: h.Key, Value: h.Value}
		}
		ce, ok, err := format.ReadCloudEvent(hs, m.Value)
		if err != nil {
			return Domain(err)
		}
		if ok {
			d.CloudEvent = &ce
			data = ce.Data
		}
		if data != nil {
			v, err := dec.Decode(ctx, f, data)
			if errors.Is(err, format.ErrUndecodable) {
				return Domain(err)
			}
			if err != nil {
				return err
			}
			d.Value = v
		}
		return h(ctx, tx, d)
	})
}
