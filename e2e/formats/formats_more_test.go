package formats

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/format"
	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

const (
	orderJSONSchema = `{"type":"object","properties":{"n":{"type":"integer"},"at":{"type":"string","format":"date-time"}},"required":["n"],"additionalProperties":false}`
	orderProto      = "syntax = \"proto3\";\npackage shop;\nmessage OrderCreated { int32 n = 1; string at = 2; }\n"
)

// decodeWith runs a message through consumer.Decode for format f.
func decodeWith(t *testing.T, cl *sr.Client, f format.Format, msg *consumer.Message) *consumer.Decoded {
	t.Helper()
	var got *consumer.Decoded
	h := consumer.Decode(format.NewDecoder(cl), f, func(_ context.Context, _ pgx.Tx, d *consumer.Decoded) error {
		got = d
		return nil
	})
	if err := h.Handle(context.Background(), nil, msg); err != nil {
		t.Fatalf("consumer decode %q: %v", msg.Value, err)
	}
	return got
}

// TestRunFormats: outboxd run against PostgreSQL, Kafka and Apicurio in
// each other format: JSON Schema with structured CloudEvents, Protobuf with
// an Avro key, and Avro from --source=poll with a payload that does not fit
// dead-lettered. Each record is read back by the registry's wire format
// and the consumer package.
func TestRunFormats(t *testing.T) {
	t.Parallel()
	reg := testenv.Registry(t)
	cl := registryClient(t, reg.URL)
	register := func(t *testing.T, subject string, s sr.Schema) int {
		t.Helper()
		return createSchema(t, cl, subject, s)
	}
	insert := func(e *e2e.Env, payload string) {
		e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, $2::jsonb)`, e.Topic, payload)
	}

	t.Run("json-schema, structured cloudevents", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		id := register(t, e.Topic+"-value", sr.Schema{Type: sr.TypeJSON, Schema: orderJSONSchema})
		d := e.Start("--value-format", "json-schema", "--schema-registry-url", reg.URL, "--cloudevents", "structured")
		insert(e, `{"n": 1, "at": "2026-12-02T09:00:00Z"}`)
		m := testenv.Kafka(t).ReadAll(t, e.Topic, 1, 60*time.Second)[0]
		if ct := e2e.Header(m, "content-type"); !strings.HasPrefix(ct, "application/cloudevents+json") {
			t.Fatalf("content-type %q", ct)
		}
		var ev map[string]any
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			t.Fatalf("structured value %s: %v", m.Value, err)
		}
		src, _ := ev["source"].(string)
		ts, _ := ev["time"].(string)
		if at, err := time.Parse(time.RFC3339Nano, ts); err != nil || !at.Truncate(time.Millisecond).Equal(m.Timestamp) { // Kafka keeps milliseconds
			t.Fatalf("time %q, want the record's timestamp %s (%v)", ts, m.Timestamp, err)
		}
		if ev["specversion"] != "1.0" || ev["id"] != e2e.Header(m, "outbox-id") || ev["type"] != e.Topic ||
			!strings.HasPrefix(src, "postgresql://127.0.0.1:") || !strings.HasSuffix(src, "/public.outbox") || ev["datacontenttype"] != "application/json" || ev["data_base64"] == nil {
			t.Fatalf("structured event %s", m.Value)
		}
		got := decodeWith(t, cl, format.JSONSchema, &consumer.Message{Topic: m.Topic, Value: m.Value, Headers: []consumer.Header{{Key: "content-type", Value: []byte(e2e.Header(m, "content-type"))}}})
		if got.CloudEvent == nil || got.CloudEvent.Mode != format.Structured || got.Value.SchemaID != id ||
			!reflect.DeepEqual(got.Value.Decoded, map[string]any{"n": json.Number("1"), "at": "2026-12-02T09:00:00Z"}) {
			t.Fatalf("consumer got %+v %+v", got.Value, got.CloudEvent)
		}
		d.Stop()
	})

	t.Run("protobuf value, avro key", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		register(t, e.Topic+"-value", sr.Schema{Type: sr.TypeProtobuf, Schema: orderProto})
		keyID := register(t, e.Topic+"-key", sr.Schema{Schema: `"string"`})
		d := e.Start("--value-format", "protobuf", "--key-format", "avro", "--schema-registry-url", reg.URL)
		insert(e, `{"n": 2, "at": "2026-12-02T09:00:00Z"}`)
		m := testenv.Kafka(t).ReadAll(t, e.Topic, 1, 60*time.Second)[0]
		var h sr.ConfluentHeader
		gotKeyID, body, err := h.DecodeID(m.Key)
		var key string
		if err == nil {
			err = avro.Unmarshal(avro.MustParse(`"string"`), body, &key)
		}
		if err != nil || gotKeyID != keyID || key != "k" {
			t.Fatalf("key % x: id %d (want %d) %q %v", m.Key, gotKeyID, keyID, key, err)
		}
		got := decodeWith(t, cl, format.Protobuf, &consumer.Message{Topic: m.Topic, Value: m.Value})
		pm := got.Value.Decoded.(*dynamicpb.Message)
		fs := pm.Descriptor().Fields()
		if pm.Get(fs.ByName("n")).Int() != 2 || pm.Get(fs.ByName("at")).String() != "2026-12-02T09:00:00Z" || string(pm.Descriptor().FullName()) != "shop.OrderCreated" {
			t.Fatalf("protobuf value %v", pm)
		}
		d.Stop()
	})

	t.Run("avro from --source=poll, binary cloudevents, dead letter", func(t *testing.T) {
		t.Parallel()
		e := e2e.NewEnv(t, 1)
		e2e.MigrateForPoll(t, e.DSN)
		register(t, e.Topic+"-value", sr.Schema{Schema: orderAvro})
		dlq := testenv.Kafka(t).Topic(t, "dlq", 1)
		d := e2e.StartDaemon(t, e.Args("--source=poll", "--poll-interval=20ms", "--value-format", "avro", "--schema-registry-url", reg.URL,
			"--cloudevents", "binary", "--dead-letter-topic", dlq)...)
		d.WaitLog("polling", 60*time.Second)
		insert(e, `{"n": 3, "at": 0}`)
		insert(e, `{"n": 3.5, "at": 0}`)
		m := testenv.Kafka(t).ReadAll(t, e.Topic, 1, 60*time.Second)[0]
		if v := referenceAvro(t, cl, m.Value); v["n"] != 3 || e2e.Header(m, "ce_id") != e2e.Header(m, "outbox-id") || e2e.Header(m, "content-type") != "application/avro" {
			t.Fatalf("value %v, headers %q", v, e2e.HeaderPairs(m))
		}
		dead := testenv.Kafka(t).ReadAll(t, dlq, 1, 60*time.Second)[0]
		if reason := e2e.Header(dead, "dlq-error"); !strings.Contains(reason, "does not fit the avro schema") {
			t.Fatalf("dead-letter headers %q", e2e.HeaderPairs(dead))
		}
		d.Stop()
	})
}

// TestReplayWritesTheFormats: outboxd replay publishes in the formats run
// does, and stops at a payload that does not fit, naming it.
func TestReplayWritesTheFormats(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	reg := testenv.Registry(t)
	cl := registryClient(t, reg.URL)
	createSchema(t, cl, e.Topic+"-value", sr.Schema{Schema: orderAvro})
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, '{"n": 1, "at": 0}'), ('k', $1, '{"n": 2, "at": 0}'), ('k', $1, '{"n": "x"}')`, e.Topic)
	args := e.Args("--from-id", "1", "--value-format", "avro", "--schema-registry-url", reg.URL)
	args[0] = "replay"
	r := e2e.StartDaemon(t, args...)
	if code := r.Wait(60 * time.Second); code == 0 || !strings.Contains(r.Out.String(), "does not fit the avro schema") {
		t.Fatalf("replay exited %d, want it to stop at the third row naming it:\n%s", code, r.Out.String())
	}
	for i, m := range testenv.Kafka(t).ReadAll(t, e.Topic, 2, 60*time.Second) {
		if v := referenceAvro(t, cl, m.Value); v["n"] != i+1 {
			t.Fatalf("record %d: %v", i, v)
		}
	}
}
