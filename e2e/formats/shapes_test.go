package formats

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// debeziumTable creates an outbox table of the Outbox Event Router's
// documented shape and returns its name.
func debeziumTable(e *e2e.Env) string {
	table := testenv.UniqueName("outboxevent")
	e.Exec(fmt.Sprintf(`CREATE TABLE %q (
		id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL,
		payload jsonb)`, table))
	e.T.Cleanup(func() { e.Exec(fmt.Sprintf(`DROP TABLE IF EXISTS %q`, table)) })
	return table
}

// dbzRow is one row of a Debezium-shaped outbox, as Postgres renders it.
type dbzRow struct {
	id, aggregateType, aggregateID, payload string
}

// TestRunDebeziumFormat feeds a table of the Outbox Event Router's shape
// and checks each record against the router's documented output with its
// defaults (and Kafka Connect's JsonConverter, schemas disabled): topic
// outbox.event.<aggregatetype> verbatim, key the aggregate id as a JSON
// string, value the payload text as a JSON string, one header: id=<uuid>.
func TestRunDebeziumFormat(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	k := testenv.Kafka(t)
	table := debeziumTable(e)
	// Upper case survives: the router routes verbatim.
	order, customer := "Order_"+table, "Customer_"+table
	e2e.CreateTopic(t, k.Brokers, "outbox.event."+order, 3)
	e2e.CreateTopic(t, k.Brokers, "outbox.event."+customer, 3)

	d := e.Start("--table", table, "--format", "debezium")
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	payloads := []string{
		`{"id": 1, "lineItems": [{"id": 1, "item": "Debezium in Action", "quantity": 2}], "customerId": 123}`,
		`{"quote": "say \"hi\"", "path": "C:\\tmp", "html": "<b>&</b>", "unicode": "größe €", "nl": "a\nb"}`,
		`{}`,
	}
	var want []dbzRow
	for i := range 30 {
		typ, agg := order, fmt.Sprintf("%d", i%4)
		if i%3 == 0 {
			typ, agg = customer, fmt.Sprintf("c-%d", i%2)
		}
		var r dbzRow
		err := c.QueryRow(ctx, fmt.Sprintf(`INSERT INTO %q (aggregatetype, aggregateid, type, payload)
			VALUES ($1, $2, 'Created', $3::jsonb) RETURNING id::text, aggregatetype, aggregateid, payload::text`, table),
			typ, agg, payloads[i%len(payloads)]).Scan(&r.id, &r.aggregateType, &r.aggregateID, &r.payload)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r)
	}
	var got []*sarama.ConsumerMessage
	got = append(got, k.ReadAll(t, "outbox.event."+order, 20, 60*time.Second)...)
	got = append(got, k.ReadAll(t, "outbox.event."+customer, 10, 60*time.Second)...)
	d.Stop()

	byID := map[string]*sarama.ConsumerMessage{}
	for _, m := range got {
		hs := e2e.HeaderPairs(m)
		if len(hs) != 1 || !strings.HasPrefix(hs[0], "id=") {
			t.Fatalf("%s/%d@%d: headers %q, want exactly one: id=<uuid>", m.Topic, m.Partition, m.Offset, hs)
		}
		id := strings.TrimPrefix(hs[0], "id=")
		if byID[id] != nil {
			t.Fatalf("event %s published twice", id)
		}
		byID[id] = m
	}
	if len(byID) != len(want) {
		t.Fatalf("%d events in Kafka, want %d", len(byID), len(want))
	}
	lastOffset := map[string]int64{} // per key: offsets rise in insert order
	for i, r := range want {
		m := byID[r.id]
		if m == nil {
			t.Fatalf("row %d (id %s) not published", i, r.id)
		}
		if want := "outbox.event." + r.aggregateType; m.Topic != want {
			t.Errorf("row %d: topic %q, want %q", i, m.Topic, want)
		}
		wantKey, _ := json.Marshal(r.aggregateID)
		if string(m.Key) != string(wantKey) {
			t.Errorf("row %d: key %s, want %s", i, m.Key, wantKey)
		}
		// The value is the payload's text as one JSON string, which
		// decodes to exactly the text Postgres renders.
		var text string
		if err := json.Unmarshal(m.Value, &text); err != nil || text != r.payload {
			t.Errorf("row %d: value %s decodes to %q (%v), want the payload text %q", i, m.Value, text, err, r.payload)
		}
		if strings.Contains(string(m.Value), `\u003c`) {
			t.Errorf("row %d: value %s escapes '<' (JsonConverter does not)", i, m.Value)
		}
		k := m.Topic + "/" + string(m.Key)
		if off, ok := lastOffset[k]; ok && m.Offset <= off {
			t.Errorf("row %d: key %s at offset %d, after an earlier event of the key at %d", i, k, m.Offset, off)
		}
		lastOffset[k] = m.Offset
	}
	// One record, as documented in the closing note.
	m := byID[want[1].id]
	t.Logf("record: topic %s key %s headers %q value %s", m.Topic, m.Key, e2e.HeaderPairs(m), m.Value)
}

// TestRunHeadersColumnAndMapping checks the parts of a mapping on
// outboxd's own table: the headers jsonb column passes a W3C trace context
// through unchanged, --header-column places a column, --topic-template
// routes, and the timestamp comes from the row.
func TestRunHeadersColumnAndMapping(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	k := testenv.Kafka(t)
	kind := testenv.UniqueName("kind")
	e2e.CreateTopic(t, k.Brokers, "events."+kind, 1)
	e.Exec(`ALTER TABLE outbox ADD COLUMN IF NOT EXISTS kind text`)
	d := e.Start("--topic-template", "events.{kind}", "--header-column", "kind=eventKind", "--timestamp-column", "created_at")
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	created := time.Date(2026, 11, 30, 12, 0, 0, 123000000, time.UTC)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, kind, headers, created_at)
		VALUES ('a-1', 'unused', '{"n": 1}', $1, jsonb_build_object('traceparent', $2::text, 'tracestate', 'congo=t61rcWkgMzE'), $3)`,
		kind, tp, created)
	got := k.ReadAll(t, "events."+kind, 1, 60*time.Second)
	d.Stop()
	if len(got) != 1 {
		t.Fatalf("%d records, want 1", len(got))
	}
	m := got[0]
	hs := e2e.HeaderPairs(m)
	// jsonb keeps an object's keys sorted (shorter first), and so do the
	// headers: tracestate before traceparent.
	wantHs := []string{"eventKind=" + kind, "tracestate=congo=t61rcWkgMzE", "traceparent=" + tp}
	// Last, the origin (system id/database/generation) for package consumer.
	if n := len(hs); n == 0 || !strings.HasPrefix(hs[n-1], "outbox-origin=") || !strings.HasSuffix(hs[n-1], "/0") {
		t.Errorf("headers %q, want outbox-origin=…/0 last", hs)
	} else {
		hs = hs[:n-1]
	}
	if len(hs) < 2 || !strings.HasPrefix(hs[0], "outbox-id=") || hs[1] != "aggregate-id=a-1" || !slices.Equal(hs[2:], wantHs) {
		t.Errorf("headers %q, want outbox-id, aggregate-id=a-1, then %q", hs, wantHs)
	}
	if !m.Timestamp.Equal(created) {
		t.Errorf("timestamp %v, want the row's %v", m.Timestamp, created)
	}
	if string(m.Key) != "a-1" || string(m.Value) != `{"n": 1}` {
		t.Errorf("key %q value %q, want raw a-1 and {\"n\": 1}", m.Key, m.Value)
	}
}

// TestRunMappedColumnPreflight: a mapped column that is missing or of the
// wrong type stops outboxd before it streams, with one line naming it.
func TestRunMappedColumnPreflight(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	table := testenv.UniqueName("badshape")
	e.Exec(fmt.Sprintf(`CREATE TABLE %q (id text PRIMARY KEY, aggregateid text, payload jsonb)`, table))
	t.Cleanup(func() { e.Exec(fmt.Sprintf(`DROP TABLE IF EXISTS %q`, table)) })
	e2e.ExpectExit(t, fmt.Sprintf(`outbox column "id" of public.%s (the id) is text, outboxd reads bigint, integer, smallint, uuid there: change its type or map another column`, table),
		e.Args("--table", table, "--format", "debezium")...)
	e.Exec(fmt.Sprintf(`ALTER TABLE %q ALTER COLUMN id TYPE uuid USING gen_random_uuid()`, table))
	e2e.ExpectExit(t, fmt.Sprintf(`outbox table public.%s has no column "aggregatetype" (the topic template placeholder): add it (see migrations/001_outbox.sql) or map another column`, table),
		e.Args("--table", table, "--format", "debezium")...)
}

// TestRunTakesOverDebeziumSlot is the handover README's migration guide
// describes: Debezium stopped, outboxd started on Debezium's own slot and
// publication (--slot debezium --publication dbz_publication --no-create).
// Debezium's footprint is reproduced without Debezium: a pgoutput slot, a
// FOR ALL TABLES publication (its autocreate mode all_tables), and the slot
// confirmed past the rows Debezium published. outboxd publishes exactly the
// rows after that position: none lost, none replayed.
func TestRunTakesOverDebeziumSlot(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	k := testenv.Kafka(t)
	table := debeziumTable(e)
	agg := "Order_" + table
	e2e.CreateTopic(t, k.Brokers, "outbox.event."+agg, 1)
	dbzSlot, dbzPub := testenv.UniqueName("debezium"), testenv.UniqueName("dbz_publication")
	e.Exec(fmt.Sprintf(`CREATE PUBLICATION %q FOR ALL TABLES`, dbzPub))
	e.Exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, dbzSlot)
	insert := func(from, to int) {
		for i := from; i < to; i++ {
			e.Exec(fmt.Sprintf(`INSERT INTO %q (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'Created', $3)`, table),
				agg, "a", fmt.Sprintf(`{"n": %d}`, i))
		}
	}
	insert(0, 50) // published by Debezium, which confirmed them
	e.Exec(`SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, dbzSlot)
	insert(50, 80) // committed while neither runs

	d := e.Start("--table", table, "--format", "debezium", "--slot", dbzSlot, "--publication", dbzPub, "--no-create")
	insert(80, 100) // while outboxd streams
	got := k.ReadAll(t, "outbox.event."+agg, 50, 60*time.Second)
	// ReadAll stops at 50: read again, asking for one more than can be
	// there, to see that nothing else arrives within 3 s.
	more := k.ReadAll(t, "outbox.event."+agg, 51, 3*time.Second)
	d.Stop()
	if len(more) != 50 || len(got) != 50 {
		t.Fatalf("%d records (then %d), want exactly the 50 rows after Debezium's confirmed position", len(got), len(more))
	}
	for i, m := range more {
		var text string
		if err := json.Unmarshal(m.Value, &text); err != nil || text != fmt.Sprintf(`{"n": %d}`, 50+i) {
			t.Fatalf("record %d: value %s, want row %d's payload (rows 0-49 were Debezium's)", i, m.Value, 50+i)
		}
	}
}

// TestRunPartitionedOutbox: an outbox partitioned by created_at, published
// through its root (the publication outboxd creates has
// publish_via_partition_root), with the oldest partition dropped while
// outboxd streams: every row is delivered, including those of the dropped
// partition that were committed before the drop.
func TestRunPartitionedOutbox(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	table := testenv.UniqueName("outbox_part")
	e.Exec(fmt.Sprintf(`CREATE TABLE %[1]q (
		id bigserial, aggregate_id text NOT NULL, topic text NOT NULL, payload jsonb NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
		CREATE TABLE %[2]q PARTITION OF %[1]q FOR VALUES FROM ('2026-11-01') TO ('2026-11-02');
		CREATE TABLE %[3]q PARTITION OF %[1]q FOR VALUES FROM ('2026-11-02') TO ('2026-11-03');`,
		table, table+"_d1", table+"_d2"))
	t.Cleanup(func() { e.Exec(fmt.Sprintf(`DROP TABLE IF EXISTS %q`, table)) })
	insert := func(day string, from, to int) {
		for i := from; i < to; i++ {
			e.Exec(fmt.Sprintf(`INSERT INTO %q (aggregate_id, topic, payload, created_at) VALUES ($1, $2, $3, $4)`, table),
				fmt.Sprintf("agg-%d", i%5), e.Topic, fmt.Sprintf(`{"n": %d}`, i), day)
		}
	}
	d := e.Start("--table", table)
	insert("2026-11-01 10:00:00+00", 0, 100)
	insert("2026-11-02 10:00:00+00", 100, 150)
	// Retention by partition: the day-1 partition goes while outboxd runs.
	e.Exec(fmt.Sprintf(`DROP TABLE %q`, table+"_d1"))
	insert("2026-11-02 11:00:00+00", 150, 200)
	got := testenv.Kafka(t).ReadAll(t, e.Topic, 200, 60*time.Second)
	d.Stop()
	seen := map[string]int{}
	last := map[string]int{}
	for _, m := range got {
		var p struct{ N int }
		if err := json.Unmarshal(m.Value, &p); err != nil {
			t.Fatalf("value %s: %v", m.Value, err)
		}
		seen[string(m.Value)]++
		if n, ok := last[string(m.Key)]; ok && p.N <= n {
			t.Errorf("key %s: event %d after %d", m.Key, p.N, n)
		}
		last[string(m.Key)] = p.N
	}
	if len(got) != 200 || len(seen) != 200 {
		t.Fatalf("%d records, %d distinct, want all 200 rows once", len(got), len(seen))
	}
}

// TestRunDebeziumNullPayloadIsTombstone: with --format=debezium a NULL
// payload is a record with a null value and the usual id header, as
// Debezium's Outbox Event Router sends it, and the rows after it arrive.
func TestRunDebeziumNullPayloadIsTombstone(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	k := testenv.Kafka(t)
	table := debeziumTable(e)
	typ := "Order_" + table
	e2e.CreateTopic(t, k.Brokers, "outbox.event."+typ, 1)
	d := e.Start("--table", table, "--format", "debezium", "--header-column", "type=eventType")
	c := e.Conn()
	defer c.Close(context.Background())
	var ids []string
	for _, p := range []*string{e2e.Ptr(`{"n": 1}`), nil, e2e.Ptr(`{"n": 3}`)} {
		var id string
		if err := c.QueryRow(context.Background(), fmt.Sprintf(`INSERT INTO %q (aggregatetype, aggregateid, type, payload)
			VALUES ($1, 'order-1', 'Deleted', $2::jsonb) RETURNING id::text`, table), typ, p).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	got := k.ReadAll(t, "outbox.event."+typ, 3, 60*time.Second)
	d.Stop()
	if len(got) != 3 {
		t.Fatalf("%d records, want 3: the tombstone and the rows around it", len(got))
	}
	m := got[1]
	if m.Value != nil || string(m.Key) != `"order-1"` || e2e.Header(m, "id") != ids[1] || e2e.Header(m, "eventType") != "Deleted" {
		t.Fatalf("NULL payload: key %s value %q headers %q, want key \"order-1\", a null value, id=%s and eventType=Deleted", m.Key, m.Value, e2e.HeaderPairs(m), ids[1])
	}
	if string(got[2].Value) != `"{\"n\": 3}"` || e2e.Header(got[2], "id") != ids[2] {
		t.Fatalf("row after the tombstone: value %s headers %q", got[2].Value, e2e.HeaderPairs(got[2]))
	}
}
