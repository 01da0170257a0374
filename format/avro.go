package format

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/hamba/avro/v2"
)

// avroCodec writes JSON payloads with one Avro schema: the payload is
// converted to the Go values hamba/avro encodes (convertAvro), and hamba
// writes the binary encoding.
type avroCodec struct {
	api    avro.API
	schema avro.Schema
}

func newAvroCodec(api avro.API, text string) (*avroCodec, error) {
	// A cache of its own: hamba's default cache is process-wide and keeps
	// the first schema of a name, which a later version of the same record
	// must not meet.
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	return &avroCodec{api: api, schema: s}, nil
}

func (c *avroCodec) index() []int { return nil }

// recordName is the schema's full name (RecordNameStrategy), "" for an
// unnamed schema.
func (c *avroCodec) recordName() string {
	if n, ok := c.schema.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return ""
}

func (c *avroCodec) encode(dst, payload []byte) ([]byte, error) {
	v, err := parseJSON(payload)
	if err != nil {
		return nil, err
	}
	native, err := convertAvro(c.schema, v, "$")
	if err != nil {
		return nil, err
	}
	body, err := c.api.Marshal(c.schema, native)
	if err != nil {
		return nil, err
	}
	return append(dst, body...), nil
}

// decode reads one value that takes exactly body (hamba's Unmarshal
// calls a body that ends early a success, and ignores a trailing rest).
func (c *avroCodec) decode(body []byte, _ []int) (any, error) {
	r := avro.NewReader(nil, 0, avro.WithReaderConfig(c.api)).Reset(body)
	var v any
	r.ReadVal(c.schema, &v)
	if r.Error != nil {
		if errors.Is(r.Error, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, r.Error
	}
	if r.Peek(); r.Error == nil {
		return nil, errors.New("data after the value")
	}
	return v, nil
}

// parseJSON parses one JSON value, numbers kept as json.Number (no float
// rounding of longs and decimals); trailing data is an error.
func parseJSON(payload []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(payload))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d.More() {
		return nil, fmt.Errorf("not JSON: data after the value")
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("not JSON: data after the value")
	}
	return v, nil
}
