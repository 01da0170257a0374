package audit_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// bench is one test's outbox table and topic on the real servers; records
// are produced by the test itself, shaped as outboxd shapes them, so that
// each verdict is built on purpose against a real broker.
type bench struct {
	t     *testing.T
	conn  *pgx.Conn
	k     *testenv.KafkaEnv
	topic string
	prod  sarama.SyncProducer
}

func newBench(t *testing.T, partitions int32) *bench {
	t.Helper()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	b := &bench{t: t, conn: pg.Conn(t), k: k, topic: k.Topic(t, "audit", partitions)}
	if _, err := migrations.Apply(context.Background(), b.conn, zap.NewNop()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	sc := k.Config()
	sc.Producer.Partitioner = kafka.NewJavaPartitioner // where outboxd puts a key
	sc.Producer.RequiredAcks = sarama.WaitForAll
	prod, err := sarama.NewSyncProducer(k.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	b.prod = prod
	return b
}

// insert writes n rows over aggs aggregates (id order is commit order per
// aggregate: one statement), every other one with a row header.
func (b *bench) insert(n, aggs int) {
	b.t.Helper()
	_, err := b.conn.Exec(context.Background(), `
		INSERT INTO outbox (aggregate_id, topic, payload, headers)
		SELECT 'agg-' || (i % $3), $1, jsonb_build_object('n', i, 'note', 'ünïcode "q"'),
		       CASE WHEN i % 2 = 0 THEN jsonb_build_object('traceparent', 'tp-' || i) END
		  FROM generate_series(1, $2) AS i ORDER BY i`, b.topic, n, aggs)
	if err != nil {
		b.t.Fatal(err)
	}
}

// message is the record outboxd would publish for row id, with origin.
func (b *bench) message(id int64, origin string) *sarama.ProducerMessage {
	b.t.Helper()
	var (
		ev      outbox.Event
		headers pgtype.Text
	)
	err := b.conn.QueryRow(context.Background(),
		`SELECT id, aggregate_id, payload::text, topic, headers::text FROM outbox WHERE id = $1`, id).
		Scan(&ev.ID, &ev.AggregateID, &ev.Payload, &ev.Topic, &headers)
	if err != nil {
		b.t.Fatalf("row %d: %v", id, err)
	}
	if headers.Valid {
		ev.Headers, _ = replication.AppendJSONHeaders(nil, []byte(headers.String), nil)
	}
	m := outbox.DefaultMapping()
	r := outbox.NewRecord(&ev, &m, time.Now())
	msg := &sarama.ProducerMessage{Topic: r.Topic, Key: sarama.ByteEncoder(r.Key), Value: sarama.ByteEncoder(r.Value), Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	if origin != "" {
		msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: []byte(outbox.HeaderOrigin), Value: []byte(origin)})
	}
	return msg
}

// send produces the records of ids, in that order, one at a time (so that
// the order of one key's records is the order given).
func (b *bench) send(origin string, ids ...int64) {
	b.t.Helper()
	for _, id := range ids {
		if _, _, err := b.prod.SendMessage(b.message(id, origin)); err != nil {
			b.t.Fatalf("produce id %d: %v", id, err)
		}
	}
}

func (b *bench) audit(mod func(*audit.Config)) *audit.Report {
	b.t.Helper()
	cfg := audit.DefaultConfig()
	cfg.FromID = 1
	cfg.StableTimeout = 30 * time.Second
	if mod != nil {
		mod(&cfg)
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = b.k.Brokers
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := audit.Run(ctx, b.conn, kcfg, cfg)
	if err != nil {
		b.t.Fatalf("audit: %v", err)
	}
	var s strings.Builder
	if err := rep.WriteText(&s); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("audit report:\n%s", s.String())
	return rep
}

func (b *bench) only(rep *audit.Report) *audit.TopicReport {
	b.t.Helper()
	for i := range rep.Topics {
		if rep.Topics[i].Topic == b.topic {
			return &rep.Topics[i]
		}
	}
	b.t.Fatalf("topic %s not in the report", b.topic)
	return nil
}

func seq(from, to int64) []int64 {
	var ids []int64
	for i := from; i <= to; i++ {
		ids = append(ids, i)
	}
	return ids
}

const origin = "7300000000000000001/db/0"

// TestAuditCleanRangeReadCommitted: every row once, in order, as outboxd
// builds it, is clean — with an aborted transaction's copy of a row and a
// record of another producer (no outbox-id) in the topic beside them: the
// audit reads read_committed and ignores records that are not outboxd's.
// The same range by created_at is clean too.
func TestAuditCleanRangeReadCommitted(t *testing.T) {
	b := newBench(t, 3)
	b.insert(30, 3)
	b.send(origin, seq(1, 30)...)

	// A copy of row 5 in a transaction that aborts: read_committed skips it.
	sc := b.k.Config()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = testenv.UniqueName("audit-txn")
	sc.Producer.Partitioner = kafka.NewJavaPartitioner
	tp, err := sarama.NewSyncProducer(b.k.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if err := tp.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.SendMessage(b.message(5, origin)); err != nil {
		t.Fatal(err)
	}
	if err := tp.AbortTxn(); err != nil {
		t.Fatal(err)
	}
	// A committed transaction of another producer's record, no outbox-id.
	if err := tp.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Key: sarama.StringEncoder("x"), Value: sarama.StringEncoder("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := tp.CommitTxn(); err != nil {
		t.Fatal(err)
	}

	rep := b.audit(nil)
	tr := b.only(rep)
	if !rep.Clean || tr.Rows != 30 || tr.Records != 30 || tr.Foreign != 1 {
		t.Fatalf("clean %v (%v), rows %d, records %d, foreign %d; want clean, 30, 30, 1", rep.Clean, rep.Verdicts, tr.Rows, tr.Records, tr.Foreign)
	}
	rep = b.audit(func(c *audit.Config) { c.FromID, c.Since = 0, time.Now().Add(-time.Hour) })
	if tr := b.only(rep); !rep.Clean || tr.Rows != 30 {
		t.Fatalf("by time: clean %v (%v), rows %d; want clean, 30", rep.Clean, rep.Verdicts, tr.Rows)
	}
	// Partitions read from an offset found by time: from before the rows,
	// everything; from after the records' timestamps, nothing.
	rep = b.audit(func(c *audit.Config) { c.FromOffsetTime = time.Now().Add(-time.Hour) })
	if tr := b.only(rep); !rep.Clean || tr.Records != 30 {
		t.Fatalf("--from-offset-time an hour ago: clean %v (%v), records %d; want clean, 30", rep.Clean, rep.Verdicts, tr.Records)
	}
	rep = b.audit(func(c *audit.Config) { c.FromOffsetTime = time.Now().Add(time.Hour) })
	if tr := b.only(rep); tr.Records != 0 || tr.Missing.Count != 30 {
		t.Fatalf("--from-offset-time in an hour: records %d, missing %d; want 0, 30", tr.Records, tr.Missing.Count)
	}
}

// TestAuditMissing: rows that never reached Kafka (written while no
// outboxd published them) are missing, listed and given as ranges for a
// repair.
func TestAuditMissing(t *testing.T) {
	b := newBench(t, 2)
	b.insert(12, 3)
	b.send(origin, slices.DeleteFunc(seq(1, 12), func(id int64) bool { return id == 4 || id == 5 || id == 9 })...)
	rep := b.audit(nil)
	tr := b.only(rep)
	if rep.Clean || tr.Missing.Count != 3 || !slices.Equal(tr.Missing.IDs, []int64{4, 5, 9}) {
		t.Fatalf("missing %+v, verdicts %v; want ids 4, 5, 9", tr.Missing, rep.Verdicts)
	}
	if got := fmt.Sprint(rep.MissingRanges()); got != "[[4 5] [9 9]]" {
		t.Fatalf("missing ranges %s, want [[4 5] [9 9]]", got)
	}
	if tr.DuplicatesSameOrigin.Count+tr.Reorders.Count+tr.Mismatches.Count+tr.Unknown.Count != 0 {
		t.Fatalf("other verdicts too: %v", rep.Verdicts)
	}
}

// TestAuditDuplicates: a re-send by the same history and a copy under
// another origin (a replay after a rewind) are told apart; with duplicates
// allowed (at-least-once) the audit is otherwise clean.
func TestAuditDuplicates(t *testing.T) {
	b := newBench(t, 2)
	b.insert(10, 2)
	b.send(origin, seq(1, 10)...)
	b.send(origin, 3)
	b.send("7300000000000000001/db/1", 7)
	rep := b.audit(nil)
	tr := b.only(rep)
	if rep.Clean || !slices.Equal(tr.DuplicatesSameOrigin.IDs, []int64{3}) || !slices.Equal(tr.DuplicatesOtherOrigin.IDs, []int64{7}) {
		t.Fatalf("same origin %+v, other origin %+v, verdicts %v; want 3 and 7", tr.DuplicatesSameOrigin, tr.DuplicatesOtherOrigin, rep.Verdicts)
	}
	if !rep.CleanIgnoring(true) || tr.Reorders.Count != 0 || tr.Mismatches.Count != 0 {
		t.Fatalf("duplicates allowed: clean %v, reorders %d, mismatches %d; want clean, 0, 0 (a re-send is not a reorder)",
			rep.CleanIgnoring(true), tr.Reorders.Count, tr.Mismatches.Count)
	}
}

// TestAuditReorder: one aggregate's first deliveries out of id order are a
// reorder, counted at the event delivered late.
func TestAuditReorder(t *testing.T) {
	b := newBench(t, 3)
	b.insert(5, 1) // one aggregate: one key, one partition
	b.send(origin, 1, 2, 4, 3, 5)
	rep := b.audit(nil)
	tr := b.only(rep)
	if rep.Clean || !slices.Equal(tr.Reorders.IDs, []int64{3}) || tr.Missing.Count != 0 {
		t.Fatalf("reorders %+v, verdicts %v; want id 3 only", tr.Reorders, rep.Verdicts)
	}
}

// TestAuditMismatch: a record whose value or headers differ from what
// outboxd builds from its row is a mismatch; with mismatch checking off
// (another record format) it is not looked for, and the report says so.
func TestAuditMismatch(t *testing.T) {
	b := newBench(t, 2)
	b.insert(8, 2)
	b.send(origin, seq(1, 5)...)
	m := b.message(6, origin)
	m.Value = sarama.StringEncoder(`{"n": 6, "note": "changed"}`)
	if _, _, err := b.prod.SendMessage(m); err != nil {
		t.Fatal(err)
	}
	b.send(origin, 7)
	m = b.message(8, origin)
	m.Headers = slices.DeleteFunc(m.Headers, func(h sarama.RecordHeader) bool { return string(h.Key) == "traceparent" })
	if _, _, err := b.prod.SendMessage(m); err != nil {
		t.Fatal(err)
	}
	rep := b.audit(nil)
	tr := b.only(rep)
	if rep.Clean || !slices.Equal(tr.Mismatches.IDs, []int64{6, 8}) || tr.Missing.Count != 0 {
		t.Fatalf("mismatches %+v, verdicts %v; want ids 6 and 8", tr.Mismatches, rep.Verdicts)
	}
	rep = b.audit(func(c *audit.Config) { c.CheckContent = false })
	if !rep.Clean || rep.ContentChecked {
		t.Fatalf("checking off: clean %v (%v), content checked %v; want clean, false", rep.Clean, rep.Verdicts, rep.ContentChecked)
	}
	var s strings.Builder
	_ = rep.WriteText(&s)
	if !strings.Contains(s.String(), "mismatch checking is off") {
		t.Fatalf("the report does not say mismatch checking is off:\n%s", s.String())
	}
}

// TestAuditRetainedAway: records whose rows retention deleted (below the
// lowest row) are proven delivered, not a verdict; a record above the
// highest row and one whose row in the middle is gone are of unknown
// origin.
func TestAuditRetainedAway(t *testing.T) {
	b := newBench(t, 2)
	b.insert(10, 2)
	b.send(origin, seq(1, 10)...)
	b.send(origin, 2) // a copy among the retained: counted by id
	if _, err := b.conn.Exec(context.Background(), `DELETE FROM outbox WHERE id <= 3`); err != nil {
		t.Fatal(err)
	}
	rep := b.audit(nil)
	tr := b.only(rep)
	if !rep.Clean || tr.Retained.Count != 3 || tr.RetainedDuplicates != 1 || !slices.Equal(tr.Retained.IDs, []int64{1, 2, 3}) || tr.Rows != 7 {
		t.Fatalf("clean %v (%v), retained %+v, retained duplicates %d, rows %d; want clean, ids 1-3, 1, 7",
			rep.Clean, rep.Verdicts, tr.Retained, tr.RetainedDuplicates, tr.Rows)
	}
	// By time, a deleted row's created_at is its record's timestamp: the
	// records below the lowest row in the window are retained, a copy
	// told apart (and not taken for a late first delivery).
	rep = b.audit(func(c *audit.Config) { c.FromID, c.Since = 0, time.Now().Add(-time.Hour) })
	if tr := b.only(rep); !rep.Clean || tr.Retained.Count != 3 || tr.RetainedDuplicates != 1 || tr.Rows != 7 {
		t.Fatalf("by time: clean %v (%v), retained %+v, retained duplicates %d, rows %d; want clean, ids 1-3, 1, 7",
			rep.Clean, rep.Verdicts, tr.Retained, tr.RetainedDuplicates, tr.Rows)
	}
	if _, err := b.conn.Exec(context.Background(), `DELETE FROM outbox WHERE id = 6`); err != nil {
		t.Fatal(err)
	}
	m := b.message(10, origin)
	for i, h := range m.Headers {
		if string(h.Key) == outbox.HeaderOutboxID {
			m.Headers[i].Value = []byte("50")
		}
	}
	if _, _, err := b.prod.SendMessage(m); err != nil {
		t.Fatal(err)
	}
	rep = b.audit(nil)
	tr = b.only(rep)
	if rep.Clean || !slices.Equal(tr.Unknown.IDs, []int64{6, 50}) || tr.Retained.Count != 3 {
		t.Fatalf("unknown %+v, retained %+v, verdicts %v; want unknown 6 and 50, 3 retained", tr.Unknown, tr.Retained, rep.Verdicts)
	}
}

// TestAuditWaitsForTheLastStableOffset: a transaction open when the audit
// starts holds the partition's last stable offset below the high watermark;
// the audit does not judge the partition before it is decided — it gives
// up at --stable-timeout naming the reason, and once the transaction
// committed, its record counts.
func TestAuditWaitsForTheLastStableOffset(t *testing.T) {
	b := newBench(t, 1)
	b.insert(4, 1)
	b.send(origin, 1, 2, 3)
	sc := b.k.Config()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = testenv.UniqueName("audit-open")
	tp, err := sarama.NewSyncProducer(b.k.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if err := tp.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.SendMessage(b.message(4, origin)); err != nil {
		t.Fatal(err)
	}
	cfg := audit.DefaultConfig()
	cfg.FromID, cfg.StableTimeout = 1, 500*time.Millisecond
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = b.k.Brokers
	_, err = audit.Run(context.Background(), b.conn, kcfg, cfg)
	if err == nil || !strings.Contains(err.Error(), "last stable offset") || !strings.Contains(err.Error(), "--stable-timeout") {
		t.Fatalf("audit with a transaction open: %v; want the last stable offset named", err)
	}
	if err := tp.CommitTxn(); err != nil {
		t.Fatal(err)
	}
	rep := b.audit(nil)
	if tr := b.only(rep); !rep.Clean || tr.Records != 4 {
		t.Fatalf("after the commit: clean %v (%v), records %d; want clean, 4", rep.Clean, rep.Verdicts, tr.Records)
	}
}
