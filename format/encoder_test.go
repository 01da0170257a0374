package format

import (
	"context"
	"encoding/binary"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
)

const orderSchema = `{
  "type": "record", "name": "OrderCreated", "namespace": "shop",
  "fields": [
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "qty", "type": "int"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}, "default": "NEW"},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
  ]
}`

func record(payload string) *kafka.Record {
	return &kafka.Record{
		Topic: "orders", Key: []byte("order-1"), Value: []byte(payload), OutboxID: 42,
		Headers:   []kafka.Header{{Key: "outbox-id", Value: []byte("42")}, {Key: "event-type", Value: []byte("shop.OrderCreated")}},
		Timestamp: time.Date(2026, 12, 2, 9, 0, 0, 123000000, time.UTC),
	}
}

func newTestEncoder(t *testing.T, cfg Config, reg Registry) *Encoder {
	t.Helper()
	e, err := NewEncoder(cfg, reg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// wire splits the Confluent wire format.
func wire(t *testing.T, b []byte) (int, []byte) {
	t.Helper()
	if len(b) < 5 || b[0] != 0 {
		t.Fatalf("not the wire format: % x", b)
	}
	return int(binary.BigEndian.Uint32(b[1:5])), b[5:]
}

func TestEncodeAvroValue(t *testing.T) {
	reg := newFakeRegistry()
	id := reg.add("orders-value", sr.Schema{Schema: orderSchema})
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}}, reg)
	r := record(`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":"2026-12-02T09:00:00.123Z","total":"12.50","note":"gift","qty":3}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	gotID, body := wire(t, r.Value)
	if gotID != id {
		t.Fatalf("schema id %d, want %d", gotID, id)
	}
	// The codec library's own decoder is the reference.
	var got map[string]any
	if err := avro.Unmarshal(avro.MustParse(orderSchema), body, &got); err != nil {
		t.Fatal(err)
	}
	if got["id"] != "7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00" || got["qty"] != 3 || got["status"] != "NEW" {
		t.Fatalf("decoded %v", got)
	}
	if at := got["at"].(time.Time); !at.Equal(time.Date(2026, 12, 2, 9, 0, 0, 123000000, time.UTC)) {
		t.Fatalf("at = %v", at)
	}
	if total := got["total"].(*big.Rat); total.Cmp(big.NewRat(1250, 100)) != 0 {
		t.Fatalf("total = %v", total)
	}
	if note := got["note"]; note != "gift" {
		t.Fatalf("note = %#v", note)
	}
	if string(r.Key) != "order-1" {
		t.Fatalf("key changed: %q", r.Key)
	}
}

func TestEncodeAvroBadPayloadIsPoison(t *testing.T) {
	reg := newFakeRegistry()
	reg.add("orders-value", sr.Schema{Schema: orderSchema})
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}}, reg)
	for _, payload := range []string{
		`{"id":"not-a-uuid","at":0,"total":"1","qty":1}`,
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1.005","qty":1}`,            // more places than scale 2
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1","qty":3000000000}`,       // int overflow
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1","qty":1,"extra":true}`,   // field the schema lacks
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1"}`,                        // missing, no default
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1","qty":1.5}`,              // fraction
		`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1","qty":1,"status":"OLD"}`, // not a symbol
		`not json`,
	} {
		r := record(payload)
		before := string(r.Value)
		err := e.Encode(context.Background(), r)
		var bad *BadPayloadError
		if !errors.As(err, &bad) || !errors.Is(err, kafka.ErrPoison) || !halt.Is(err) {
			t.Fatalf("%s: err = %v, want a poison BadPayloadError", payload, err)
		}
		if string(r.Value) != before {
			t.Fatalf("%s: record changed on error", payload)
		}
	}
}

func TestEncodeRegistryErrorsAreNotPoison(t *testing.T) {
	reg := newFakeRegistry()
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}}, reg)
	err := e.Encode(context.Background(), record(`{}`))
	var re *RegistryError
	if !errors.As(err, &re) || errors.Is(err, kafka.ErrPoison) || halt.Is(err) || re.Subject != "orders-value" {
		t.Fatalf("no subject: err = %v, want a RegistryError for orders-value", err)
	}
	reg.down = true
	err = e.Encode(context.Background(), record(`{}`))
	if !errors.Is(err, ErrRegistry) || errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("registry down: err = %v", err)
	}
}

func TestEncodeAutoRegisterAndNewVersionAfterTTL(t *testing.T) {
	reg := newFakeRegistry()
	v1 := `{"type":"record","name":"E","fields":[{"name":"a","type":"int"}]}`
	e := newTestEncoder(t, Config{Value: Side{Format: Avro, Schema: v1}, AutoRegister: true, CacheTTL: time.Minute}, reg)
	now := time.Unix(1000, 0)
	e.sc.now = func() time.Time { return now }
	r := record(`{"a":1}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if id, _ := wire(t, r.Value); id != 1 {
		t.Fatalf("id %d, want the registered 1", id)
	}
	v2 := `{"type":"record","name":"E","fields":[{"name":"a","type":"int"},{"name":"b","type":"string","default":"x"}]}`
	reg.add("orders-value", sr.Schema{Schema: v2})
	r = record(`{"a":1,"b":"y"}`)
	if err := e.Encode(context.Background(), r); err == nil {
		t.Fatal("version 1 is cached: b is unknown to it, want an error")
	}
	now = now.Add(2 * time.Minute)
	r = record(`{"a":1,"b":"y"}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if id, _ := wire(t, r.Value); id != 2 {
		t.Fatalf("id %d, want version 2's id 2 after the TTL", id)
	}
}

func TestEncodePinnedIDAndRecordStrategy(t *testing.T) {
	reg := newFakeRegistry()
	other := reg.add("x", sr.Schema{Schema: `"string"`})
	reg.add("shop.OrderCreated", sr.Schema{Schema: `{"type":"record","name":"OrderCreated","namespace":"shop","fields":[{"name":"a","type":"long"}]}`})
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}, Strategy: RecordName}, reg)
	r := record(`{"a":7}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if id, _ := wire(t, r.Value); id != 2 {
		t.Fatalf("id %d, want the record subject's 2", id)
	}
	// Pinned, the subject is not needed: not even an event type for the
	// record strategy.
	e = newTestEncoder(t, Config{Value: Side{Format: Avro, SchemaID: other}, Strategy: RecordName}, reg)
	r = record(`"hello"`)
	r.Headers = r.Headers[:1]
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if id, body := wire(t, r.Value); id != other || string(body) != "\x0ahello" {
		t.Fatalf("pinned: id %d body %q", id, body)
	}
}

func TestEncodeKeyAvroString(t *testing.T) {
	reg := newFakeRegistry()
	id := reg.add("orders-key", sr.Schema{Schema: `"string"`})
	e := newTestEncoder(t, Config{Key: Side{Format: Avro}}, reg)
	r := record(`{}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if got, body := wire(t, r.Key); got != id || string(body) != "\x0eorder-1" {
		t.Fatalf("key: id %d body %q", got, body)
	}
	if string(r.Value) != `{}` {
		t.Fatalf("value changed: %q", r.Value)
	}
}

func TestEncodeJSONSchema(t *testing.T) {
	reg := newFakeRegistry()
	id := reg.add("orders-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"a":{"type":"integer"},"at":{"type":"string","format":"date-time"}},"required":["a"],"additionalProperties":false}`})
	e := newTestEncoder(t, Config{Value: Side{Format: JSONSchema}}, reg)
	r := record(`{"a":1,"at":"2026-12-02T09:00:00Z"}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if got, body := wire(t, r.Value); got != id || string(body) != `{"a":1,"at":"2026-12-02T09:00:00Z"}` {
		t.Fatalf("id %d body %q", got, body)
	}
	for _, p := range []string{`{"a":"1"}`, `{"b":1,"a":1}`, `{"a":1,"at":"yesterday"}`, `{`} {
		if err := e.Encode(context.Background(), record(p)); !errors.Is(err, kafka.ErrPoison) {
			t.Fatalf("%s: err = %v, want poison", p, err)
		}
	}
}

func TestCloudEventsBinary(t *testing.T) {
	reg := newFakeRegistry()
	reg.add("orders-value", sr.Schema{Schema: `{"type":"record","name":"E","fields":[{"name":"a","type":"int"}]}`})
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}, CloudEvents: Binary, Source: "/outboxd/shop"}, reg)
	r := record(`{"a":1}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ce_specversion": "1.0", "ce_id": "42", "ce_source": "/outboxd/shop", "ce_type": "shop.OrderCreated",
		"ce_time": "2026-12-02T09:00:00.123Z", "content-type": "application/avro",
	}
	for k, v := range want {
		if got := headerValue(r.Headers, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if _, body := wire(t, r.Value); string(body) != "\x02" {
		t.Fatalf("value body %q: the data stays in the value format", body)
	}
}

func TestCloudEventsStructured(t *testing.T) {
	e := newTestEncoder(t, Config{CloudEvents: Structured, Source: "/outboxd/shop"}, nil)
	r := record(`{"a":1}`)
	if err := e.Encode(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	want := `{"specversion":"1.0","id":"42","source":"/outboxd/shop","type":"shop.OrderCreated","time":"2026-12-02T09:00:00.123Z","datacontenttype":"application/json","data":{"a":1}}`
	if string(r.Value) != want {
		t.Fatalf("value\n %s\nwant\n %s", r.Value, want)
	}
	if got := headerValue(r.Headers, "content-type"); !strings.HasPrefix(got, "application/cloudevents+json") {
		t.Fatalf("content-type %q", got)
	}
	tomb := record("")
	tomb.Value = nil
	if err := e.Encode(context.Background(), tomb); err != nil || tomb.Value != nil || headerValue(tomb.Headers, "ce_id") != "42" {
		t.Fatalf("tombstone: err %v value %q", err, tomb.Value)
	}
}

func TestCloudEventsBinaryContentTypeOfARawPayload(t *testing.T) {
	e := newTestEncoder(t, Config{CloudEvents: Binary, Source: "/s"}, nil)
	for payload, want := range map[string]string{`{"a":1}`: "application/json", "\x00\x01 not json": "application/octet-stream"} {
		r := record(payload)
		if err := e.Encode(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if got := headerValue(r.Headers, "content-type"); got != want || string(r.Value) != payload {
			t.Fatalf("%q: content-type %q (want %q), value %q", payload, got, want, r.Value)
		}
	}
}
