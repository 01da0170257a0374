package testenv_test

// Smoke tests: the dev stack is real. PostgreSQL decodes pgoutput over a
// replication connection, Kafka takes an idempotent produce and gives back
// key, value and headers, and the private servers survive stop/start.

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outboxd/internal/testenv"
)

func TestPostgresPgoutputDecodes(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE TABLE outbox (id bigint PRIMARY KEY, topic text NOT NULL, payload text)`)
	pg.Exec(t, `CREATE PUBLICATION smoke_pub FOR TABLE outbox`)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, pg.ReplicationDSN())
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	defer conn.Close(context.Background())

	slot := testenv.UniqueName("smoke_slot")
	_, err = pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication})
	if err != nil {
		t.Fatalf("create slot: %v", err)
	}
	pg.Exec(t, `INSERT INTO outbox (id, topic, payload) VALUES ($1, $2, $3)`, 42, "orders", "hello")

	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'smoke_pub'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}

	var got []pglogrepl.Message
	for len(got) == 0 || got[len(got)-1].Type() != pglogrepl.MessageTypeCommit {
		raw, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive after %d messages: %v", len(got), err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok {
			t.Fatalf("unexpected message %T", raw)
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			// Nothing to answer: the test ends long before wal_sender_timeout.
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				t.Fatalf("parse XLogData: %v", err)
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				t.Fatalf("parse pgoutput: %v", err)
			}
			got = append(got, m)
		}
	}

	if len(got) != 4 {
		t.Fatalf("got %d messages %v, want Begin, Relation, Insert, Commit", len(got), types(got))
	}
	if _, ok := got[0].(*pglogrepl.BeginMessage); !ok {
		t.Errorf("message 0 is %T, want Begin", got[0])
	}
	rel, ok := got[1].(*pglogrepl.RelationMessage)
	if !ok {
		t.Fatalf("message 1 is %T, want Relation", got[1])
	}
	if rel.Namespace != "public" || rel.RelationName != "outbox" || len(rel.Columns) != 3 ||
		rel.Columns[0].Name != "id" || rel.Columns[2].Name != "payload" {
		t.Errorf("relation = %s.%s with %d columns", rel.Namespace, rel.RelationName, len(rel.Columns))
	}
	ins, ok := got[2].(*pglogrepl.InsertMessage)
	if !ok {
		t.Fatalf("message 2 is %T, want Insert", got[2])
	}
	if ins.RelationID != rel.RelationID {
		t.Errorf("insert into relation %d, want %d", ins.RelationID, rel.RelationID)
	}
	want := []string{"42", "orders", "hello"}
	if len(ins.Tuple.Columns) != len(want) {
		t.Fatalf("insert has %d columns, want %d", len(ins.Tuple.Columns), len(want))
	}
	for i, col := range ins.Tuple.Columns {
		if col.DataType != pglogrepl.TupleDataTypeText || string(col.Data) != want[i] {
			t.Errorf("column %d = %c %q, want text %q", i, col.DataType, col.Data, want[i])
		}
	}
	if _, ok := got[3].(*pglogrepl.CommitMessage); !ok {
		t.Errorf("message 3 is %T, want Commit", got[3])
	}
}

func types(ms []pglogrepl.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Type().String())
	}
	return out
}

func TestKafkaIdempotentRoundTrip(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	topic := k.Topic(t, "smoke", 1)

	cfg := k.Config()
	cfg.Version = sarama.V4_1_0_0
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	producer, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()

	headers := []sarama.RecordHeader{
		{Key: []byte("id"), Value: []byte("7f0c1d9e")},
		{Key: []byte("type"), Value: []byte("OrderCreated")},
	}
	_, _, err = producer.SendMessage(&sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder("order-1"),
		Value:   sarama.StringEncoder(`{"total":42}`),
		Headers: headers,
	})
	if err != nil {
		t.Fatalf("send: %v", err)
	}

	msgs := k.ReadAll(t, topic, 1, 30*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("read %d messages, want 1", len(msgs))
	}
	m := msgs[0]
	if string(m.Key) != "order-1" || string(m.Value) != `{"total":42}` {
		t.Errorf("got key %q value %q", m.Key, m.Value)
	}
	if len(m.Headers) != len(headers) {
		t.Fatalf("got %d headers, want %d", len(m.Headers), len(headers))
	}
	for i, h := range m.Headers {
		if !bytes.Equal(h.Key, headers[i].Key) || !bytes.Equal(h.Value, headers[i].Value) {
			t.Errorf("header %d = %q:%q, want %q:%q", i, h.Key, h.Value, headers[i].Key, headers[i].Value)
		}
	}
}

func TestStartKafkaStopStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartKafka(t)
	k := &testenv.KafkaEnv{Brokers: srv.Brokers}
	topic := k.Topic(t, "restart", 1)

	send := func(value string) {
		t.Helper()
		producer, err := sarama.NewSyncProducer(k.Brokers, k.Config())
		if err != nil {
			t.Fatalf("producer: %v", err)
		}
		defer producer.Close()
		if _, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(value)}); err != nil {
			t.Fatalf("send %s: %v", value, err)
		}
	}
	send("before-stop")

	srv.Stop()
	if c, err := net.DialTimeout("tcp", srv.Brokers[0], time.Second); err == nil {
		c.Close()
		t.Fatalf("broker %s still accepts connections after Stop", srv.Brokers[0])
	}
	srv.Start()
	send("after-start")

	srv.Kill()
	srv.Start()
	msgs := k.ReadAll(t, topic, 2, 30*time.Second)
	if len(msgs) != 2 || string(msgs[0].Value) != "before-stop" || string(msgs[1].Value) != "after-start" {
		t.Fatalf("after stop/start and kill/start read %d messages, want before-stop, after-start", len(msgs))
	}
}

func TestStartPostgresRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgres(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// query runs sql on a new connection and returns the one text value it yields.
	query := func(sql string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, srv.DSN)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		var out string
		if err := conn.QueryRow(ctx, sql).Scan(&out); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return out
	}
	if got := query(`SHOW wal_level`); got != "logical" {
		t.Errorf("wal_level = %s, want logical", got)
	}
	// A committed row that must survive every restart below.
	conn, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept AS SELECT 'still here'::text AS v`); err != nil {
		t.Fatalf("create table: %v", err)
	}
	conn.Close(ctx)

	srv.Restart("fast")
	if got := query(`SELECT v FROM kept`); got != "still here" {
		t.Errorf("after fast restart: %q", got)
	}
	srv.Restart("immediate") // crash recovery on start
	if got := query(`SELECT v FROM kept`); got != "still here" {
		t.Errorf("after immediate restart: %q", got)
	}

	srv.Stop("fast")
	if conn, err := pgx.Connect(ctx, srv.DSN); err == nil {
		conn.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	srv.Start()
	if got := query(`SELECT 'up again'`); got != "up again" {
		t.Errorf("after start: %q", got)
	}
}
