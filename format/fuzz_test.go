package format

import (
	"bytes"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/dynamicpb"
	"testing"

	"github.com/hamba/avro/v2"
)

const unionSchema = `{
  "type": "record", "name": "U",
  "fields": [
    {"name": "u", "type": ["null", "int", "string", {"type": "record", "name": "R", "fields": [{"name": "x", "type": "double"}]},
      {"type": "long", "logicalType": "timestamp-micros"}, {"type": "array", "items": "boolean"}]},
    {"name": "m", "type": {"type": "map", "values": {"type": "fixed", "name": "F", "size": 2}}, "default": {}},
    {"name": "d", "type": {"type": "fixed", "name": "D", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3}, "default": "\u0000\u0000\u0000\u0000\u0000\u0000\u0000\u0000"},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": null},
    {"name": "f", "type": "float", "default": 0}
  ]
}`

// FuzzConvertAvro: any payload either fails with an error (a bad event)
// or converts to values hamba/avro writes and reads back; never a panic,
// never a conversion the codec then refuses.
func FuzzConvertAvro(f *testing.F) {
	for _, seed := range []string{
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":"2026-12-02T09:00:00.123Z","total":"12.50","note":"gift","qty":3}`,
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":1700000000000,"total":99999999.99,"note":{"string":"x"},"qty":-1,"tags":["a"],"status":"PAID"}`,
		`{"u":null}`, `{"u":1}`, `{"u":"s"}`, `{"u":{"x":1.5}}`, `{"u":{"R":{"x":2}}}`, `{"u":{"long.timestamp-micros":"2026-01-01T00:00:00.000001Z"}}`,
		`{"u":[true,false],"m":{"k":"ab"},"d":"123456789.123","day":"2026-12-02","f":1e38}`,
		`{"u":{"int":2147483648}}`, `{"u":1,"f":1e39}`, `{"u":1,"d":1e400}`, `[]`, `"x"`, `{"u":1,"m":{"k":"\u0100b"}}`,
	} {
		f.Add(seed)
	}
	api := avro.Config{}.Freeze()
	schemas := []avro.Schema{avro.MustParse(orderSchema), avro.MustParse(unionSchema)}
	f.Fuzz(func(t *testing.T, payload string) {
		for _, s := range schemas {
			v, err := parseJSON([]byte(payload))
			if err != nil {
				return
			}
			native, err := convertAvro(s, v, "$")
			if err != nil {
				continue
			}
			b, err := api.Marshal(s, native)
			if err != nil {
				t.Fatalf("converted %s but hamba refuses it: %v (%#v)", payload, err, native)
			}
			var back any
			if err := api.Unmarshal(s, b, &back); err != nil {
				t.Fatalf("%s: written but not readable: %v", payload, err)
			}
		}
	})
}

// FuzzEncodeProtobuf: any payload is written or refused as poison; what is
// written decodes to the same message.
func FuzzEncodeProtobuf(f *testing.F) {
	for _, seed := range []string{`{"id":"o1","qty":"3","at":"2026-12-02T09:00:00.500Z","status":"PAID","lines":[{"sku":"a","n":2}]}`,
		`{"qty":-9223372036854775808}`, `{"status":1}`, `{"at":"0001-01-01T00:00:00Z"}`, `{"lines":[{}]}`, `{"id":"\u0000"}`, `null`} {
		f.Add(seed)
	}
	c, err := newProtobufCodec(orderProto, "shop.OrderCreated")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload string) {
		b, err := c.encode(nil, []byte(payload))
		if err != nil {
			return
		}
		m, err := c.decode(b, c.index())
		if err != nil {
			t.Fatalf("%s: written but not readable: %v", payload, err)
		}
		again, err := c.encode(nil, []byte(protojson.Format(m.(*dynamicpb.Message))))
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%s: decoded value does not write the same bytes (%v)", payload, err)
		}
	})
}
