package consumer

// Integration tests against the real PostgreSQL and Kafka of the dev stack
// (internal/testenv): each test has its own database, topics and group.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
)

// newDB gives the test a database with the dedup table (Migrate) and an
// effects table the test handlers write to, and a pool on it.
func newDB(t *testing.T) (*testenv.PG, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if err := Migrate(ctx, conn, DefaultConfig().DedupTable); err != nil {
		t.Fatalf("consumer.Migrate: %v", err)
	}
	pg.Exec(t, `CREATE TABLE effects (outbox_id bigint PRIMARY KEY, n int NOT NULL DEFAULT 1)`)
	pool, err := pgxpool.New(ctx, pg.DSN)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pg, pool
}

// effectHandler inserts the outbox id into effects (so a doubled effect
// fails the primary key), after the failures scripted for that id.
func effectHandler(sh *scriptHandler) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := sh.Handle(ctx, tx, m); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (outbox_id) VALUES ($1)`, m.OutboxID); err != nil {
			return fmt.Errorf("insert effect: %w", err)
		}
		return nil
	})
}

func queryInts(t *testing.T, pool *pgxpool.Pool, sql string) []int64 {
	t.Helper()
	rows, _ := pool.Query(context.Background(), sql)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return ids
}

// rec is a record to produce: id 0 means no outbox-id header.
type rec struct {
	id  int64
	key string
}

func produce(t *testing.T, k *testenv.KafkaEnv, topic string, recs ...rec) {
	t.Helper()
	p, err := sarama.NewSyncProducer(k.Brokers, k.Config())
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer p.Close()
	for _, r := range recs {
		m := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(r.key),
			Value: sarama.StringEncoder(fmt.Sprintf(`{"id": %d}`, r.id))}
		m.Headers = []sarama.RecordHeader{{Key: []byte("aggregate-id"), Value: []byte(r.key)}}
		if r.id != 0 {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(HeaderOutboxID), Value: []byte(strconv.FormatInt(r.id, 10))})
		}
		if _, _, err := p.SendMessage(m); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

func committedOffset(t *testing.T, k *testenv.KafkaEnv, group, topic string) int64 {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer admin.Close()
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		t.Fatalf("list offsets: %v", err)
	}
	b := resp.GetBlock(topic, 0)
	if b == nil {
		return -1
	}
	return b.Offset
}

func integrationConfig(k *testenv.KafkaEnv, topic string) Config {
	cfg := DefaultConfig()
	cfg.Brokers = k.Brokers
	cfg.GroupID = testenv.UniqueName("group")
	cfg.Topics = []string{topic}
	cfg.BackoffBase, cfg.BackoffMax = 10*time.Millisecond, 40*time.Millisecond
	cfg.CommitInterval = 0
	cfg.SessionTimeout = 6 * time.Second
	return cfg
}

// running is a Consumer.Run in the background.
type running struct {
	c      *Consumer
	cancel context.CancelFunc
	errc   chan error
}

func start(t *testing.T, cfg Config, pool *pgxpool.Pool, h Handler) *running {
	t.Helper()
	c, err := New(cfg, pool, h, zaptest.NewLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.errc:
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return r
}

// waitDone waits until the consumer has done n messages.
func (r *running) waitDone(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for r.c.Stats().Done < n {
		if time.Now().After(deadline) {
			t.Fatalf("done %+v, want %d within 60s", r.c.Stats(), n)
		}
		select {
		case err := <-r.errc:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop cancels Run and returns its error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.errc:
		r.errc <- nil // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

// The dedup row and the handler's writes commit or roll back together.
func TestStoreDedupInHandlerTransaction(t *testing.T) {
	t.Parallel()
	_, pool := newDB(t)
	ctx := context.Background()
	st, err := newPGStore(pool, "processed_outbox_ids")
	if err != nil {
		t.Fatal(err)
	}
	m := &Message{Topic: "t", OutboxID: 42}
	sh := newScriptHandler()
	sh.script[42] = []error{errFlaky}
	h := effectHandler(sh)

	if dup, err := st.attempt(ctx, m, h); dup || !errors.Is(err, errFlaky) {
		t.Fatalf("failing handler: dup %v, err %v", dup, err)
	}
	if ids := queryInts(t, pool, `SELECT outbox_id FROM processed_outbox_ids UNION ALL SELECT outbox_id FROM effects`); len(ids) != 0 {
		t.Fatalf("after a failed attempt the tables hold %v, want nothing", ids)
	}
	if dup, err := st.attempt(ctx, m, h); dup || err != nil {
		t.Fatalf("second attempt: dup %v, err %v", dup, err)
	}
	for range 2 {
		if dup, err := st.attempt(ctx, m, h); !dup || err != nil {
			t.Fatalf("redelivery: dup %v, err %v; want a duplicate", dup, err)
		}
	}
	if sh.calls[42] != 2 {
		t.Fatalf("handler called %d times, want 2 (duplicates skip it)", sh.calls[42])
	}
	if got := queryInts(t, pool, `SELECT count(*) FROM effects`); got[0] != 1 {
		t.Fatalf("%d effects, want 1", got[0])
	}
	if got := queryInts(t, pool, `SELECT duplicates FROM processed_outbox_ids WHERE outbox_id = 42 AND topic = 't'`); !slices.Equal(got, []int64{2}) {
		t.Fatalf("duplicates %v, want [2]", got)
	}

	// A missing dedup table is the database's problem, never the message's.
	bad, _ := newPGStore(pool, "no_such_table")
	if _, err := bad.attempt(ctx, &Message{OutboxID: 1}, h); !errors.As(err, new(*dbError)) {
		t.Fatalf("missing table: err %v, want a *dbError", err)
	}
}

// Poison messages (domain error, no outbox id, transient failures past the
// retries) go to the DLQ with their headers, and the messages behind them on
// the same partition are processed; redeliveries are skipped; the committed
// offset covers everything.
func TestRunPoisonDoesNotBlockPartition(t *testing.T) {
	t.Parallel()
	_, pool := newDB(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "cons_poison", 1)
	dlq := k.Topic(t, "cons_poison_dlq", 1)
	cfg := integrationConfig(k, topic)
	cfg.DeadLetterTopic = func(string) string { return dlq }

	sh := newScriptHandler()
	sh.always[2] = Domainf("invalid transition sent_to_establishment → completed")
	sh.script[3] = []error{errFlaky, errFlaky}
	sh.always[4] = errFlaky
	produce(t, k, topic, rec{1, "a"}, rec{2, "a"}, rec{0, "a"}, rec{3, "a"}, rec{4, "a"}, rec{5, "a"}, rec{1, "a"})

	r := start(t, cfg, pool, effectHandler(sh))
	r.waitDone(t, 7)
	st := r.c.Stats()
	if st.Processed != 3 || st.Duplicates != 1 || st.DeadLettered != 3 || st.Retries != 2+5 {
		t.Fatalf("stats %+v, want processed 3, duplicates 1, dead-lettered 3, retries 7", st)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := queryInts(t, pool, `SELECT outbox_id FROM effects ORDER BY 1`); !slices.Equal(got, []int64{1, 3, 5}) {
		t.Fatalf("effects %v, want [1 3 5]", got)
	}
	if got := queryInts(t, pool, `SELECT outbox_id FROM processed_outbox_ids ORDER BY 1`); !slices.Equal(got, []int64{1, 3, 5}) {
		t.Fatalf("processed ids %v, want [1 3 5] (dead-lettered ones are not recorded)", got)
	}
	if off := committedOffset(t, k, cfg.GroupID, topic); off != 7 {
		t.Fatalf("committed offset %d, want 7", off)
	}

	got := k.ReadAll(t, dlq, 3, 30*time.Second)
	if len(got) != 3 {
		t.Fatalf("%d dead-letter records, want 3", len(got))
	}
	want := []struct {
		offset, id, value, attempts, class, errText string
	}{
		{"1", "2", `{"id": 2}`, "1", ClassDomain, "invalid transition sent_to_establishment → completed"},
		{"2", "", `{"id": 0}`, "1", ClassDomain, "no valid outbox-id header: the header is missing"},
		{"4", "4", `{"id": 4}`, "6", ClassTransient, "flaky"},
	}
	for i, w := range want {
		m := got[i]
		h := map[string]string{}
		for _, rh := range m.Headers {
			h[string(rh.Key)] = string(rh.Value)
		}
		if string(m.Key) != "a" || string(m.Value) != w.value {
			t.Errorf("record %d: key %q value %q: want the original", i, m.Key, m.Value)
		}
		if h[HeaderSourceOffset] != w.offset || h[HeaderSourceTopic] != topic || h[HeaderSourcePartition] != "0" ||
			h[HeaderAttempts] != w.attempts || h[HeaderErrorClass] != w.class || h[HeaderError] != w.errText ||
			h[HeaderConsumerGroup] != cfg.GroupID || h["aggregate-id"] != "a" || h[HeaderOutboxID] != w.id {
			t.Errorf("record %d headers %v, want source offset %s, attempts %s, class %s, error %q, outbox-id %q",
				i, h, w.offset, w.attempts, w.class, w.errText, w.id)
		}
	}
}

// When the dead-letter topic does not exist (auto-create is off), the
// message's offset is not committed and Run stops with a *DeadLetterError;
// once the topic exists, a restarted consumer dead-letters it and goes on.
func TestRunDeadLetterPublishFailure(t *testing.T) {
	t.Parallel()
	_, pool := newDB(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "cons_dlqfail", 1)
	dlq := testenv.UniqueName("cons_dlqfail_missing")
	cfg := integrationConfig(k, topic)
	cfg.DeadLetterTopic = func(string) string { return dlq }
	sh := newScriptHandler()
	sh.always[2] = Domainf("poison")
	produce(t, k, topic, rec{1, "a"}, rec{2, "a"}, rec{3, "a"})

	r := start(t, cfg, pool, effectHandler(sh))
	var err error
	select {
	case err = <-r.errc:
		r.errc <- err
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not stop on the dead-letter failure")
	}
	var dle *DeadLetterError
	if !errors.As(err, &dle) || dle.Offset != 1 || dle.DeadLetterTopic != dlq {
		t.Fatalf("Run = %v, want a *DeadLetterError for offset 1", err)
	}
	if off := committedOffset(t, k, cfg.GroupID, topic); off != 1 {
		t.Fatalf("committed offset %d, want 1 (the failed message is not done)", off)
	}
	if got := queryInts(t, pool, `SELECT outbox_id FROM effects ORDER BY 1`); !slices.Equal(got, []int64{1}) {
		t.Fatalf("effects %v, want [1]: nothing after the failed message", got)
	}

	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(dlq, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create %s: %v", dlq, err)
	}
	t.Cleanup(func() { _ = admin.DeleteTopic(dlq) })

	r2 := start(t, cfg, pool, effectHandler(sh))
	r2.waitDone(t, 2)
	if err := r2.stop(t); err != nil {
		t.Fatalf("second Run: %v", err)
	}
	if got := k.ReadAll(t, dlq, 1, 30*time.Second); len(got) != 1 || string(got[0].Value) != `{"id": 2}` {
		t.Fatalf("dead-letter topic holds %d records, want outbox id 2", len(got))
	}
	if got := queryInts(t, pool, `SELECT outbox_id FROM effects ORDER BY 1`); !slices.Equal(got, []int64{1, 3}) {
		t.Fatalf("effects %v, want [1 3]", got)
	}
	if off := committedOffset(t, k, cfg.GroupID, topic); off != 3 {
		t.Fatalf("committed offset %d, want 3", off)
	}
}
