package format

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/kafka"
)

func headersOf(r *kafka.Record) []Header {
	hs := make([]Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = Header{Key: h.Key, Value: h.Value}
	}
	return hs
}

func TestDecodeWhatEncodeWrote(t *testing.T) {
	reg := newFakeRegistry()
	reg.add("orders-value", sr.Schema{Schema: orderSchema})
	ctx := context.Background()
	for _, mode := range []CloudEvents{NoCloudEvents, Binary, Structured} {
		e := newTestEncoder(t, Config{Value: Side{Format: Avro}, CloudEvents: mode, Source: "/s"}, reg)
		r := record(`{"id":"7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00","at":0,"total":"1.5","qty":2}`)
		if err := e.Encode(ctx, r); err != nil {
			t.Fatal(err)
		}
		data := r.Value
		ce, ok, err := ReadCloudEvent(headersOf(r), r.Value)
		if err != nil || ok != (mode != NoCloudEvents) {
			t.Fatalf("%q: ReadCloudEvent ok=%v err=%v", mode, ok, err)
		}
		if ok {
			if ce.Mode != mode || ce.ID != "42" || ce.Type != "shop.OrderCreated" || ce.Source != "/s" || ce.SpecVersion != "1.0" || ce.DataContentType != "application/avro" {
				t.Fatalf("%q: attributes %+v", mode, ce)
			}
			data = ce.Data
		}
		v, err := NewDecoder(reg).Decode(ctx, Avro, data)
		if err != nil {
			t.Fatalf("%q: %v", mode, err)
		}
		if m := v.Decoded.(map[string]any); v.SchemaID != 1 || v.Schema.Schema != orderSchema || m["qty"] != 2 || m["id"] != "7b0e5a4e-1c1a-4f7e-9b51-0d3c2a1e9f00" {
			t.Fatalf("%q: decoded %+v", mode, v)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	reg := newFakeRegistry()
	reg.add("x", sr.Schema{Schema: `"int"`})
	d := NewDecoder(reg)
	ctx := context.Background()
	for _, b := range [][]byte{nil, {1, 0, 0, 0, 1}, {0, 0, 0}, {0, 0, 0, 0, 1}, {0, 0, 0, 0, 1, 0x80}} {
		if _, err := d.Decode(ctx, Avro, b); !errors.Is(err, ErrUndecodable) {
			t.Fatalf("% x: err = %v, want ErrUndecodable", b, err)
		}
	}
	reg.down = true
	if _, err := NewDecoder(reg).Decode(ctx, Avro, []byte{0, 0, 0, 0, 1, 2}); !errors.Is(err, ErrRegistry) || errors.Is(err, ErrUndecodable) {
		t.Fatalf("registry down: err = %v, want a registry error (retry)", err)
	}
}

// FuzzDecode: any bytes decode or fail with an error; never a panic.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{{0, 0, 0, 0, 1, 2}, {0, 0, 0, 0, 2, 0x0a, 'h', 'e', 'l', 'l', 'o'}, {0, 0, 0, 0, 3, 2, 0}, {0}, {0, 0, 0, 0, 9}, {0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		f.Add(seed)
	}
	reg := newFakeRegistry()
	reg.add("a", sr.Schema{Schema: `"int"`})
	reg.add("b", sr.Schema{Schema: orderSchema})
	reg.add("c", sr.Schema{Schema: unionSchema})
	d := NewDecoder(reg)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = d.Decode(context.Background(), Avro, b)
		_, _, _ = ReadCloudEvent([]Header{{Key: "content-type", Value: []byte("application/cloudevents+json")}}, b)
	})
}

// TestReadCloudEventDuplicateAttributeRefused: a record carrying an
// attribute header twice (a writer's copy beside outboxd's, from an outboxd
// before it refused such events) is undecodable, whichever copy is first.
func TestReadCloudEventDuplicateAttributeRefused(t *testing.T) {
	binary := []Header{{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte("forged")}, {Key: "ce_id", Value: []byte("42")}}
	structured := []Header{{Key: "content-type", Value: []byte(contentTypeStructured)}, {Key: "content-type", Value: []byte("text/plain")}}
	for name, hs := range map[string][]Header{"binary ce_id": binary, "structured content-type": structured} {
		if _, ok, err := ReadCloudEvent(hs, []byte(`{"specversion":"1.0","id":"1"}`)); !ok || !errors.Is(err, ErrUndecodable) {
			t.Errorf("%s: ok=%v err=%v, want an undecodable CloudEvent", name, ok, err)
		}
	}
}
