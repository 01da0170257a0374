package format

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"
)

// BenchmarkEncode is the encoder's CPU cost per event for each format, the
// schema cached (the registry is asked once per CacheTTL per subject).
func BenchmarkEncode(b *testing.B) {
	payload := `{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":"2026-12-02T09:00:00.123Z","total":"12.50","note":"gift","qty":3,"status":"PAID","tags":["a","b"]}`
	reg := newFakeRegistry()
	reg.add("orders-value", sr.Schema{Schema: orderSchema})
	protoReg := newFakeRegistry()
	protoReg.add("orders-value", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; package shop;
message OrderCreated { string id = 1; string at = 2; string total = 3; string note = 4; int32 qty = 5; string status = 6; repeated string tags = 7; }`})
	jsReg := newFakeRegistry()
	jsReg.add("orders-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"at":{"type":"string","format":"date-time"},"total":{"type":"string"},"note":{"type":"string"},"qty":{"type":"integer"},"status":{"enum":["NEW","PAID"]},"tags":{"type":"array","items":{"type":"string"}}},"required":["id","qty"],"additionalProperties":false}`})
	for _, c := range []struct {
		name string
		cfg  Config
		reg  Registry
	}{
		{"json", Config{Value: Side{Format: JSON}}, nil},
		{"avro", Config{Value: Side{Format: Avro}}, reg},
		{"protobuf", Config{Value: Side{Format: Protobuf}}, protoReg},
		{"json-schema", Config{Value: Side{Format: JSONSchema}}, jsReg},
		{"cloudevents-binary", Config{CloudEvents: Binary, Source: "/s"}, nil},
		{"cloudevents-structured", Config{CloudEvents: Structured, Source: "/s"}, nil},
		{"avro+cloudevents-binary", Config{Value: Side{Format: Avro}, CloudEvents: Binary, Source: "/s"}, reg},
	} {
		b.Run(c.name, func(b *testing.B) {
			e, err := NewEncoder(c.cfg, c.reg, zap.NewNop(), nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := e.Encode(ctx, record(payload)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
