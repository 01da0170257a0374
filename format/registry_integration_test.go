package format

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopRegistry()
	os.Exit(code)
}

func apicurio(t *testing.T) *sr.Client {
	t.Helper()
	srv := testenv.Registry(t)
	cl, err := sr.NewClient(sr.URLs(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// referenceDecode reads a record value as a Confluent consumer would: the
// id from the wire format, the schema by id from the registry, the body
// with hamba/avro — none of the encoder's code.
func referenceDecode(t *testing.T, cl *sr.Client, value []byte) map[string]any {
	t.Helper()
	var h sr.ConfluentHeader
	id, body, err := h.DecodeID(value)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cl.SchemaByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := avro.Unmarshal(avro.MustParse(s.Schema), body, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestApicurioAvroLatestVersionAndEvolution(t *testing.T) {
	cl := apicurio(t)
	ctx := context.Background()
	topic := testenv.UniqueName("fmt_avro")
	v1 := `{"type":"record","name":"E","namespace":"t","fields":[{"name":"a","type":"int"}]}`
	if _, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Schema: v1}); err != nil {
		t.Fatal(err)
	}
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}, CacheTTL: time.Nanosecond}, cl)
	r := record(`{"a":5}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := referenceDecode(t, cl, r.Value); got["a"] != 5 {
		t.Fatalf("decoded %v", got)
	}
	// A compatible new version is used at the next lookup, no restart.
	v2 := `{"type":"record","name":"E","namespace":"t","fields":[{"name":"a","type":"int"},{"name":"b","type":["null","string"],"default":null}]}`
	if _, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Schema: v2}); err != nil {
		t.Fatal(err)
	}
	r = record(`{"a":6,"b":"x"}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := referenceDecode(t, cl, r.Value); got["a"] != 6 || got["b"] != "x" {
		t.Fatalf("decoded %v", got)
	}
	// A payload that fits no version is poison.
	r = record(`{"a":"six"}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); !errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("err = %v, want poison", err)
	}
}

func TestApicurioMissingSubjectAndAutoRegister(t *testing.T) {
	cl := apicurio(t)
	ctx := context.Background()
	topic := testenv.UniqueName("fmt_auto")
	e := newTestEncoder(t, Config{Value: Side{Format: Avro}}, cl)
	r := record(`{"a":1}`)
	r.Topic = topic
	var re *RegistryError
	if err := e.Encode(ctx, r); !errors.As(err, &re) || errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("missing subject: err = %v, want a RegistryError (retry), not poison", err)
	}
	schema := `{"type":"record","name":"A","fields":[{"name":"a","type":"long"}]}`
	e = newTestEncoder(t, Config{Value: Side{Format: Avro, Schema: schema}, AutoRegister: true}, cl)
	if err := e.Encode(ctx, r); err != nil {
		t.Fatal(err)
	}
	if got := referenceDecode(t, cl, r.Value); got["a"] != int64(1) {
		t.Fatalf("decoded %v", got)
	}
	if ss, err := cl.SchemaByVersion(ctx, topic+"-value", -1); err != nil || ss.Version != 1 {
		t.Fatalf("registered: %+v %v", ss, err)
	}
}

func TestApicurioJSONSchema(t *testing.T) {
	cl := apicurio(t)
	ctx := context.Background()
	topic := testenv.UniqueName("fmt_json")
	ss, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`})
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEncoder(t, Config{Value: Side{Format: JSONSchema}}, cl)
	r := record(`{"a":1}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); err != nil {
		t.Fatal(err)
	}
	var h sr.ConfluentHeader
	if id, body, err := h.DecodeID(r.Value); err != nil || id != ss.ID || string(body) != `{"a":1}` {
		t.Fatalf("id %d (want %d) body %q err %v", id, ss.ID, body, err)
	}
	r = record(`{"b":1}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); !errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("err = %v, want poison", err)
	}
}

func TestApicurioProtobuf(t *testing.T) {
	cl := apicurio(t)
	ctx := context.Background()
	topic := testenv.UniqueName("fmt_proto")
	ss, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Type: sr.TypeProtobuf, Schema: orderProto})
	if err != nil {
		t.Fatal(err)
	}
	e := newTestEncoder(t, Config{Value: Side{Format: Protobuf, Message: "shop.OrderCreated"}}, cl)
	r := record(`{"id":"o1","qty":"3","at":"2026-12-02T09:00:00.500Z"}`)
	r.Topic = topic
	if err := e.Encode(ctx, r); err != nil {
		t.Fatal(err)
	}
	v, err := NewDecoder(cl).Decode(ctx, Protobuf, r.Value)
	if err != nil {
		t.Fatal(err)
	}
	if v.SchemaID != ss.ID || len(v.Index) != 1 || v.Index[0] != 1 {
		t.Fatalf("id %d (want %d), index %v", v.SchemaID, ss.ID, v.Index)
	}
	m := v.Decoded.(*dynamicpb.Message)
	if qty := m.Get(m.Descriptor().Fields().ByName("qty")).Int(); qty != 3 {
		t.Fatalf("decoded %v", m)
	}
}
