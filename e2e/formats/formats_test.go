package formats

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/format"
	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

const orderAvro = `{"type":"record","name":"OrderCreated","namespace":"shop","fields":[
  {"name":"n","type":"int"},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"note","type":["null","string"],"default":null}]}`

// registryMu serializes schema registrations of this package's parallel
// tests: Apicurio's in-memory (H2) storage times out locking its id
// sequence under concurrent registrations.
var registryMu sync.Mutex

func createSchema(t *testing.T, cl *sr.Client, subject string, s sr.Schema) int {
	t.Helper()
	registryMu.Lock()
	defer registryMu.Unlock()
	ss, err := cl.CreateSchema(context.Background(), subject, s)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

func registryClient(t *testing.T, url string) *sr.Client {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// referenceAvro decodes a record value as any Confluent-compatible consumer
// would: the schema by the id in the wire format, from the registry, and
// hamba/avro — not outboxd's code.
func referenceAvro(t *testing.T, cl *sr.Client, value []byte) map[string]any {
	t.Helper()
	var h sr.ConfluentHeader
	id, body, err := h.DecodeID(value)
	if err != nil {
		t.Fatalf("value % x: %v", value, err)
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

// consumerDecoded runs a Kafka message through the consumer package's
// decoding handler and returns what the handler got.
func consumerDecoded(t *testing.T, cl *sr.Client, m *sarama.ConsumerMessage) *consumer.Decoded {
	t.Helper()
	msg := &consumer.Message{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	for _, h := range m.Headers {
		msg.Headers = append(msg.Headers, consumer.Header{Key: string(h.Key), Value: h.Value})
	}
	var got *consumer.Decoded
	h := consumer.Decode(format.NewDecoder(cl), format.Avro, func(_ context.Context, _ pgx.Tx, d *consumer.Decoded) error {
		got = d
		return nil
	})
	if err := h.Handle(context.Background(), nil, msg); err != nil {
		t.Fatalf("consumer decode %s: %v", m.Value, err)
	}
	return got
}

func insertTyped(t *testing.T, e *e2e.Env, payload string) {
	t.Helper()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, event_type, created_at) VALUES ('k', $1, $2::jsonb, 'shop.OrderCreated', '2026-12-02 09:00:00.5+00')`, e.Topic, payload)
}

// TestRunAvroCloudEventsBinaryDeadLettersWhatDoesNotFit: outboxd run
// --value-format avro against Apicurio: each row's JSON payload becomes an
// Avro record in the wire format that a reference decoder and the consumer
// package read back; --cloudevents binary sets every attribute; a payload
// that does not fit the schema goes to the dead-letter topic with the
// reason, and the stream goes on.
func TestRunAvroCloudEventsBinaryDeadLettersWhatDoesNotFit(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	e.Exec(`ALTER TABLE outbox ADD COLUMN event_type text`)
	reg := testenv.Registry(t)
	cl := registryClient(t, reg.URL)
	id := createSchema(t, cl, e.Topic+"-value", sr.Schema{Schema: orderAvro})
	dlq := testenv.Kafka(t).Topic(t, "dlq", 1)
	d := e.Start("--value-format", "avro", "--schema-registry-url", reg.URL,
		"--cloudevents", "binary", "--cloudevents-source", "/shop/orders", "--dead-letter-topic", dlq)
	insertTyped(t, e, `{"n": 1, "at": "2026-12-02T09:00:00.5Z", "note": "first"}`)
	insertTyped(t, e, `{"n": "two", "at": 0}`)
	insertTyped(t, e, `{"n": 3, "at": 1796202000500}`)

	msgs := testenv.Kafka(t).ReadAll(t, e.Topic, 2, 60*time.Second)
	for i, m := range msgs {
		wantN := []int{1, 3}[i]
		ref := referenceAvro(t, cl, m.Value)
		if ref["n"] != wantN || !ref["at"].(time.Time).Equal(time.Date(2026, 12, 2, 9, 0, 0, 500e6, time.UTC)) {
			t.Fatalf("record %d decodes to %v", i, ref)
		}
		got := consumerDecoded(t, cl, m)
		if v := got.Value.Decoded.(map[string]any); v["n"] != wantN || got.Value.SchemaID != id {
			t.Fatalf("consumer decoded %+v", got.Value)
		}
		ce := got.CloudEvent
		if ce == nil || ce.Mode != format.Binary || ce.SpecVersion != "1.0" || ce.ID != e2e.Header(m, "outbox-id") || ce.Source != "/shop/orders" ||
			ce.Type != "shop.OrderCreated" || ce.Time != "2026-12-02T09:00:00.5Z" || ce.DataContentType != "application/avro" {
			t.Fatalf("cloudevent %+v, headers %q", ce, e2e.HeaderPairs(m))
		}
	}
	dead := testenv.Kafka(t).ReadAll(t, dlq, 1, 60*time.Second)
	if reason := e2e.Header(dead[0], "dlq-error"); !strings.Contains(reason, "does not fit the avro schema") || !strings.Contains(reason, "$.n") {
		t.Fatalf("dead-letter reason %q, want the schema mismatch", reason)
	}
	if !strings.Contains(string(dead[0].Value), `\"two\"`) {
		t.Fatalf("dead-letter value %s, want the row's payload", dead[0].Value)
	}
	d.Stop()
}

// TestRunAvroBadPayloadHaltsNamingTheSkip: without a dead-letter topic a
// payload that does not fit halts outboxd with the --skip-bad-event that
// skips it; restarted with it, the next row is published.
func TestRunAvroBadPayloadHaltsNamingTheSkip(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	e.Exec(`ALTER TABLE outbox ADD COLUMN event_type text`)
	reg := testenv.Registry(t)
	cl := registryClient(t, reg.URL)
	createSchema(t, cl, e.Topic+"-value", sr.Schema{Schema: orderAvro})
	args := []string{"--value-format", "avro", "--schema-registry-url", reg.URL}
	d := e.Start(args...)
	insertTyped(t, e, `{"n": 1, "at": 0, "extra": true}`)
	insertTyped(t, e, `{"n": 2, "at": 0}`)
	if code := d.Wait(60 * time.Second); code == 0 {
		t.Fatal("outboxd exited 0, want a halt")
	}
	out := d.Out.String()
	m := regexp.MustCompile(`start outboxd again with( --skip-bad-event [0-9A-F]+/[0-9A-F]+);`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "has no such field") {
		t.Fatalf("halt without --skip-bad-event and the reason:\n%s", out)
	}
	d = e.Start(append(args, strings.Fields(m[1])...)...)
	got := testenv.Kafka(t).ReadAll(t, e.Topic, 1, 60*time.Second)
	if v := referenceAvro(t, cl, got[0].Value); v["n"] != 2 {
		t.Fatalf("after the skip: %v, want n=2", v)
	}
	d.Stop()
}

// TestRunAvroRegistryDownAtStart: with the registry down, outboxd keeps
// retrying and publishes nothing; once it is up (auto-registration on: the
// in-memory registry starts empty) every row arrives, none lost.
func TestRunAvroRegistryDownAtStart(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	reg := testenv.StartRegistry(t)
	reg.Stop()
	schema := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(schema, []byte(orderAvro), 0o600); err != nil {
		t.Fatal(err)
	}
	d := e.Start("--value-format", "avro", "--schema-registry-url", reg.URL,
		"--auto-register-schemas", "--value-schema-file", schema)
	for i := 1; i <= 3; i++ {
		e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, jsonb_build_object('n', $2::int, 'at', 0))`, e.Topic, i)
	}
	d.WaitLog("schema registry", 60*time.Second) // a session failed on it, and restarts
	if d.Exited() {
		t.Fatalf("outboxd exited with the registry down:\n%s", d.Out.String())
	}
	reg.Start()
	cl := registryClient(t, reg.URL)
	got := testenv.Kafka(t).ReadAll(t, e.Topic, 3, 90*time.Second)
	for i, m := range got {
		if v := referenceAvro(t, cl, m.Value); v["n"] != i+1 {
			t.Fatalf("record %d: %v", i, v)
		}
	}
	d.Stop()
}

// TestRunAvroNewVersionAndRegistryDownMidStream: a compatible new version
// registered while outboxd runs is used without a restart; a registry that
// goes away mid-stream makes outboxd retry (publishing nothing it could not
// encode, exiting never), and once it is back every row arrives in order.
func TestRunAvroNewVersionAndRegistryDownMidStream(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	reg := testenv.StartRegistry(t)
	schema := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(schema, []byte(orderAvro), 0o600); err != nil {
		t.Fatal(err)
	}
	d := e.Start("--value-format", "avro", "--schema-registry-url", reg.URL, "--schema-cache-ttl", "1ms",
		"--auto-register-schemas", "--value-schema-file", schema)
	cl := registryClient(t, reg.URL)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, '{"n": 1, "at": 0}')`, e.Topic)
	testenv.Kafka(t).ReadAll(t, e.Topic, 1, 60*time.Second)

	v2 := strings.Replace(orderAvro, `{"name":"n","type":"int"},`, `{"name":"n","type":"int"},{"name":"tag","type":"string","default":""},`, 1)
	createSchema(t, cl, e.Topic+"-value", sr.Schema{Schema: v2})
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, '{"n": 2, "at": 0, "tag": "v2"}')`, e.Topic)
	before := testenv.Kafka(t).ReadAll(t, e.Topic, 2, 60*time.Second)
	if referenceAvro(t, cl, before[0].Value)["n"] != 1 || referenceAvro(t, cl, before[1].Value)["tag"] != "v2" {
		t.Fatal("the new version was not used")
	}

	// Row 2 must be confirmed before the registry goes: the registry comes
	// back empty and holds only outboxd's schema file, which has no "tag",
	// so a row 2 sent again after the restart does not fit it and halts
	// (a bad payload) — what a CI run did, under load, as the test's loop
	// waited for a third record.
	e.WaitConfirmed(30 * time.Second)
	reg.Stop()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, '{"n": 3, "at": 0}')`, e.Topic)
	d.WaitLog("schema registry", 60*time.Second)
	if d.Exited() {
		t.Fatalf("outboxd exited with the registry down:\n%s", d.Out.String())
	}
	reg.Start() // empty again (in memory): outboxd registers its schema file
	// At least once: a restart may send again what was not confirmed yet;
	// the distinct records, in first-seen order, must be the three rows.
	// Bounded: a CI run looped here for 21 min after outboxd had exited.
	var distinct [][]byte
	for want := 3; len(distinct) < 3; want++ {
		if d.Exited() || want > 20 {
			t.Fatalf("after the registry came back: %d distinct records of 3 (exited %v, code %d):\n%s", len(distinct), d.Exited(), d.Code, d.Out.String())
		}
		seen := map[string]bool{}
		distinct = nil
		for _, m := range testenv.Kafka(t).ReadAll(t, e.Topic, want, 30*time.Second) {
			if !seen[string(m.Value)] {
				seen[string(m.Value)] = true
				distinct = append(distinct, m.Value)
			}
		}
	}
	// The registry forgot the ids of the first two (in-memory storage):
	// they are compared as bytes, the third decoded with the new ids.
	if string(distinct[0]) != string(before[0].Value) || string(distinct[1]) != string(before[1].Value) ||
		referenceAvro(t, cl, distinct[2])["n"] != 3 {
		t.Fatal("want every row, in order")
	}
	d.Stop()
}
