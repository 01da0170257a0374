package poll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

// migrated gives the test its own database with the outbox migrations
// applied and the table migrated for polling: outboxd migrate --source=poll.
func migrated(t *testing.T) *testenv.PG {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := Migrate(context.Background(), conn, "public", "outbox"); err != nil {
		t.Fatalf("poll.Migrate: %v", err)
	}
	return pg
}

func testConfig(pg *testenv.PG) Config {
	c := DefaultConfig()
	c.ConnString = pg.DSN
	c.Interval = 10 * time.Millisecond
	c.BatchSize = 50
	c.ShutdownTimeout = 5 * time.Second
	c.RestartBackoffMin = 20 * time.Millisecond
	c.RestartBackoffMax = 100 * time.Millisecond
	return c
}

// running is a Poller's Run in a goroutine.
type running struct {
	p      *Poller
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config, deps Deps) *running {
	t.Helper()
	p, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), nil, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{p: p, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- p.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and returns its result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // stop may be called again (cleanup)
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
		return nil
	}
}

// wait returns Run's result once it returned by itself.
func (r *running) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %s", timeout)
		return nil
	}
}

func kafkaProducer(t *testing.T, k *testenv.KafkaEnv) func() (outbox.Producer, error) {
	t.Helper()
	kc := kafka.DefaultConfig()
	kc.Brokers = k.Brokers
	return func() (outbox.Producer, error) {
		return kafka.NewProducer(kc, nil, kafka.ProducerHooks{})
	}
}

func fakeFactory(p *fakeProducer) func() (outbox.Producer, error) {
	return func() (outbox.Producer, error) { return p, nil }
}

func count(t *testing.T, pg *testenv.PG, where string) int {
	t.Helper()
	var n int
	conn := pg.Conn(t)
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitCount(t *testing.T, pg *testenv.PG, where string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		n := count(t, pg, where)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("count(%s) = %d after %s, want %d", where, n, timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

func outboxID(t *testing.T, m *sarama.ConsumerMessage) int64 {
	t.Helper()
	id, err := strconv.ParseInt(header(m, outbox.HeaderOutboxID), 10, 64)
	if err != nil {
		t.Fatalf("record without an outbox-id header: %v", m.Headers)
	}
	return id
}

// TestPublishesWhatCDCPublishes runs CDC (the replication stream and the
// publisher pipeline) and the poller over the same rows, each to its own
// default topic, and compares the records partition by partition: key,
// value, headers, timestamp and order must be identical.
func TestPublishesWhatCDCPublishes(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	k := testenv.Kafka(t)
	cdcTopic, pollTopic := k.Topic(t, "cdc", 3), k.Topic(t, "poll", 3)
	ctx := context.Background()
	pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN topic DROP NOT NULL, ADD COLUMN event_type text`)

	// CDC first: its slot must exist before the rows are written.
	scfg := slot.DefaultConfig()
	scfg.Slot, scfg.Publication = testenv.UniqueName("poll_parity"), "poll_parity"
	if _, err := slot.Ensure(ctx, pg.Conn(t), scfg, true); err != nil {
		t.Fatal(err)
	}
	pcfg := publisher.DefaultConfig()
	pcfg.DefaultTopic = cdcTopic
	pcfg.ShutdownTimeout = 10 * time.Second
	svc := publisher.NewService(pcfg, zap.NewNop(), nil, publisher.Deps{
		OpenSource: func(ctx context.Context) (publisher.Source, error) {
			return replication.Open(ctx, replication.StreamConfig{
				ConnString: pg.DSN, Slot: scfg.Slot, Publication: scfg.Publication,
				StatusInterval: 200 * time.Millisecond,
				Decoder:        replication.DecoderConfig{Columns: replication.DefaultColumns()},
			}, zap.NewNop())
		},
		NewProducer: func(publisher.Identity) (outbox.Producer, error) { return kafkaProducer(t, k)() },
	})
	cdcCtx, stopCDC := context.WithCancel(ctx)
	cdcDone := make(chan error, 1)
	go func() { cdcDone <- svc.Run(cdcCtx) }()
	defer func() {
		stopCDC()
		if err := <-cdcDone; err != nil {
			t.Errorf("CDC service: %v", err)
		}
	}()

	// One sequential writer: commit order is id order, so both sources
	// must send the same sequence.
	conn := pg.Conn(t)
	const n = 300
	for i := range n {
		payload := fmt.Sprintf(`{"i": %d, "note": "ünïcode \"q\" \\ tab\t", "nested": {"b": [1, 2.50, null], "a": true}}`, i)
		var eventType any
		if i%3 != 0 {
			eventType = fmt.Sprintf("type-%d", i%5)
		}
		created := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC).Add(time.Duration(i) * time.Millisecond)
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload, event_type, created_at) VALUES ($1, NULL, $2, $3, $4)`,
			fmt.Sprintf("agg-%d", i%17), payload, eventType, created); err != nil {
			t.Fatal(err)
		}
	}

	cfg := testConfig(pg)
	cfg.DefaultTopic = pollTopic
	r := start(t, cfg, Deps{NewProducer: kafkaProducer(t, k)})
	waitCount(t, pg, "published_at IS NULL", 0, 60*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	fromCDC := k.ReadAll(t, cdcTopic, n, 60*time.Second)
	fromPoll := k.ReadAll(t, pollTopic, n, 60*time.Second)
	if len(fromCDC) != n || len(fromPoll) != n {
		t.Fatalf("read %d records from CDC and %d from polling, want %d each", len(fromCDC), len(fromPoll), n)
	}
	byPartition := func(ms []*sarama.ConsumerMessage) map[int32][]*sarama.ConsumerMessage {
		out := map[int32][]*sarama.ConsumerMessage{}
		for _, m := range ms {
			out[m.Partition] = append(out[m.Partition], m)
		}
		for _, l := range out {
			slices.SortFunc(l, func(a, b *sarama.ConsumerMessage) int { return int(a.Offset - b.Offset) })
		}
		return out
	}
	cdc, pol := byPartition(fromCDC), byPartition(fromPoll)
	if len(cdc) != len(pol) {
		t.Fatalf("CDC used %d partitions, polling %d", len(cdc), len(pol))
	}
	differ := 0
	for p, cms := range cdc {
		pms := pol[p]
		if len(cms) != len(pms) {
			t.Fatalf("partition %d: CDC %d records, polling %d", p, len(cms), len(pms))
		}
		for i := range cms {
			c, q := cms[i], pms[i]
			same := bytes.Equal(c.Key, q.Key) && bytes.Equal(c.Value, q.Value) &&
				c.Timestamp.Equal(q.Timestamp) && len(c.Headers) == len(q.Headers)
			for j := 0; same && j < len(c.Headers); j++ {
				same = bytes.Equal(c.Headers[j].Key, q.Headers[j].Key) && bytes.Equal(c.Headers[j].Value, q.Headers[j].Value)
			}
			if !same {
				if differ < 3 {
					t.Errorf("partition %d offset %d differs:\n  cdc  key %q value %q ts %s headers %s\n  poll key %q value %q ts %s headers %s",
						p, i, c.Key, c.Value, c.Timestamp, headers(c), q.Key, q.Value, q.Timestamp, headers(q))
				}
				differ++
			}
		}
	}
	if differ > 0 {
		t.Fatalf("%d of %d records differ between CDC and polling", differ, n)
	}
}

func headers(m *sarama.ConsumerMessage) string {
	var b strings.Builder
	for _, h := range m.Headers {
		fmt.Fprintf(&b, "%s=%q ", h.Key, h.Value)
	}
	return b.String()
}

// TestWorkersAndProcessesShareTheTable: two pollers of three workers each,
// while four writers insert, publish every row exactly once.
func TestWorkersAndProcessesShareTheTable(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "share", 4)
	cfg := testConfig(pg)
	cfg.Workers = 3
	cfg.BatchSize = 20
	start(t, cfg, Deps{NewProducer: kafkaProducer(t, k)})
	start(t, cfg, Deps{NewProducer: kafkaProducer(t, k)})

	const writers, perWriter = 4, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(context.Background(), pg.DSN)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(context.Background())
			for i := 0; i < perWriter; i += 5 {
				_, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregate_id, topic, payload)
					SELECT $1, $2, jsonb_build_object('i', g) FROM generate_series($3::int, $3::int + 4) g`,
					fmt.Sprintf("w%d", w), topic, i)
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	const total = writers * perWriter
	waitCount(t, pg, "published_at IS NULL", 0, 60*time.Second)
	got := k.ReadAll(t, topic, total+1, 5*time.Second) // +1: wait out stragglers
	seen := map[int64]int{}
	for _, m := range got {
		seen[outboxID(t, m)]++
	}
	dups := 0
	for _, c := range seen {
		dups += c - 1
	}
	if len(seen) != total || dups != 0 {
		t.Fatalf("Kafka holds %d distinct ids (want %d) and %d duplicates (want 0)", len(seen), total, dups)
	}
}

// TestLateCommittingLowerIDIsPublishedAfterHigherID shows the ordering
// weakness the package documents: a transaction that drew a lower id but
// commits later is published after a higher id, by a later poll.
func TestLateCommittingLowerIDIsPublishedAfterHigherID(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "late", 1)
	ctx := context.Background()

	slow, err := pg.Conn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int64 {
		var id int64
		if err := q.QueryRow(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('order-1', $1, '{}') RETURNING id`, topic).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	low := insert(slow)        // drawn first, not committed yet
	high := insert(pg.Conn(t)) // committed at once
	if low >= high {
		t.Fatalf("ids %d, %d: want the first lower", low, high)
	}

	start(t, testConfig(pg), Deps{NewProducer: kafkaProducer(t, k)})
	waitCount(t, pg, "published_at IS NOT NULL", 1, 30*time.Second) // high only
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitCount(t, pg, "published_at IS NULL", 0, 30*time.Second)

	got := k.ReadAll(t, topic, 2, 30*time.Second)
	if len(got) != 2 {
		t.Fatalf("read %d records, want 2", len(got))
	}
	order := []int64{outboxID(t, got[0]), outboxID(t, got[1])}
	if want := []int64{high, low}; !slices.Equal(order, want) {
		t.Fatalf("published in order %v, want %v (the late lower id last)", order, want)
	}
}

// TestFailedProduceRollsBackAndRetries: while Kafka fails, nothing is marked
// published; after it recovers every row is, and no row is lost.
func TestFailedProduceRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 120)`)
	var mu sync.Mutex
	failing := true
	fp := newFakeProducer(time.Millisecond, func(r *kafka.Record) error {
		mu.Lock()
		defer mu.Unlock()
		if failing {
			return &kafka.ProduceError{OutboxID: r.OutboxID, Topic: r.Topic, Err: errors.New("broker down")}
		}
		return nil
	})
	// A new producer per session, as after a real failure.
	newProducer := func() (outbox.Producer, error) { return newFakeProducer(fp.delay, fp.fail), nil }
	r := start(t, testConfig(pg), Deps{NewProducer: newProducer})
	time.Sleep(500 * time.Millisecond)
	if n := count(t, pg, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows marked published while every produce failed", n)
	}
	if got := restarts(t, r.p.m, "kafka"); got < 2 {
		t.Fatalf("%v restarts after failures, want ≥ 2", got)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	waitCount(t, pg, "published_at IS NULL", 0, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestPoisonHaltsWithoutDeadLetterTopic: a row Kafka refuses for good stops
// the poller and stays unpublished, with the rest of its batch.
func TestPoisonHaltsWithoutDeadLetterTopic(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', jsonb_build_object('g', g) FROM generate_series(1, 10) g`)
	fp := newFakeProducer(0, func(r *kafka.Record) error {
		if r.OutboxID == 4 {
			return &kafka.PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Err: sarama.ErrMessageSizeTooLarge}
		}
		return nil
	})
	r := start(t, testConfig(pg), Deps{NewProducer: fakeFactory(fp)})
	err := r.wait(t, 30*time.Second)
	if !errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("Run returned %v, want a poison error", err)
	}
	if n := count(t, pg, "published_at IS NULL"); n != 10 {
		t.Fatalf("%d rows unpublished after the poison batch rolled back, want 10", n)
	}
}

// TestPoisonGoesToDeadLetterTopic: with a dead-letter producer the poison row
// (one Kafka refuses, one without a topic) is diverted and marked, and the
// poller goes on.
func TestPoisonGoesToDeadLetterTopic(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN topic DROP NOT NULL`)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', CASE WHEN g = 7 THEN NULL ELSE 't' END, '{}' FROM generate_series(1, 10) g`)
	fp := newFakeProducer(0, func(r *kafka.Record) error {
		if r.OutboxID == 4 {
			return &kafka.PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Err: sarama.ErrMessageSizeTooLarge}
		}
		return nil
	})
	dlq := &fakeDLQ{}
	cfg := testConfig(pg)
	cfg.DeadLetterTopic = "dlq"
	r := start(t, cfg, Deps{NewProducer: fakeFactory(fp),
		NewDeadLetterer: func() (outbox.DeadLetterer, error) { return dlq, nil }})
	waitCount(t, pg, "published_at IS NULL", 0, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	got := dlq.ids()
	slices.Sort(got)
	if !slices.Equal(got, []int64{4, 7}) {
		t.Fatalf("dead-lettered %v, want [4 7]", got)
	}
	if sent := fp.ids(); slices.Contains(sent, 7) || len(sent) != 9 {
		t.Fatalf("sent %v to Kafka, want the 9 rows with a topic", sent)
	}
}

// TestShutdownFinishesTheBatchInFlight: cancelling Run waits for the acks of
// the batch in flight and marks it; after the shutdown timeout it rolls back.
func TestShutdownFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		timeout       time.Duration
		wantPublished int
	}{
		{"acks within timeout", 5 * time.Second, 5},
		{"timeout first", 100 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := migrated(t)
			pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 5)`)
			fp := newFakeProducer(time.Second, nil)
			cfg := testConfig(pg)
			cfg.ShutdownTimeout = tc.timeout
			r := start(t, cfg, Deps{NewProducer: fakeFactory(fp)})
			deadline := time.Now().Add(10 * time.Second)
			for len(fp.ids()) < 5 {
				if time.Now().After(deadline) {
					t.Fatal("the batch was not sent within 10s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := r.stop(t); err != nil {
				t.Fatalf("Run after cancel: %v", err)
			}
			if n := count(t, pg, "published_at IS NOT NULL"); n != tc.wantPublished {
				t.Fatalf("%d rows marked published, want %d", n, tc.wantPublished)
			}
		})
	}
}

// TestSchemaErrorsHalt: a table the poller cannot use stops it at once with
// a message that says what to do.
func TestSchemaErrorsHalt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, setup, want string
	}{
		{"no table", `SELECT 1`, `outbox table public.outbox does not exist: run "outboxd migrate --source=poll" or create it`},
		{"not migrated", `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text, topic text, payload jsonb)`,
			`outbox table public.outbox has no column "published_at": run "outboxd migrate --source=poll" (poll.Migrate adds it)`},
		{"no topic", `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text, payload jsonb, published_at timestamptz)`,
			`outbox table public.outbox has no column "topic": add it (see migrations/001_outbox.sql) or configure a default topic`},
		{"text id", `CREATE TABLE outbox (id text PRIMARY KEY, aggregate_id text, topic text, payload jsonb, published_at timestamptz)`,
			`column "id" has type text, want an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t)
			pg.Exec(t, tc.setup)
			r := start(t, testConfig(pg), Deps{NewProducer: fakeFactory(newFakeProducer(0, nil))})
			err := r.wait(t, 30*time.Second)
			if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run returned %v, want ErrSchema saying %q", err, tc.want)
			}
		})
	}
}

// TestNullPayloadHalts: a row CDC could not publish either stops the poller.
func TestNullPayloadHalts(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text, topic text, payload jsonb, published_at timestamptz)`)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('a', 't', NULL)`)
	r := start(t, testConfig(pg), Deps{NewProducer: fakeFactory(newFakeProducer(0, nil))})
	err := r.wait(t, 30*time.Second)
	if !errors.Is(err, ErrBadRow) || !strings.Contains(err.Error(), `outbox row id=1: column "payload" is NULL`) {
		t.Fatalf("Run returned %v, want ErrBadRow for the NULL payload", err)
	}
}

func restarts(t *testing.T, m *Metrics, cause string) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Restarts.WithLabelValues(cause).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.ConnString = "postgres://x"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults with a DSN: %v", err)
	}
	bad := Config{Interval: -1, BatchSize: 0, Workers: 100, RestartBackoffMin: 2, RestartBackoffMax: 1, Mapping: outbox.Mapping{DefaultTopic: "x"}, DeadLetterTopic: "x"}
	err := bad.Validate()
	for _, want := range []string{"no PostgreSQL connection string", "outbox table must be named", "poll interval must be > 0",
		"poll batch size must be in 1..100000", "poll workers must be in 1..64", "shutdown timeout must be > 0",
		"restart backoff must satisfy", "dead-letter topic must differ"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to say %q", err, want)
		}
	}
}

// failingHook fails its first fails calls, then records what it saw.
type failingHook struct {
	mu    sync.Mutex
	fails int
	seen  map[int64]int
}

func (h *failingHook) AfterPublish(_ context.Context, r *kafka.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fails > 0 {
		h.fails--
		return fmt.Errorf("%w: test", outbox.ErrHook)
	}
	h.seen[r.OutboxID]++
	return nil
}

// TestHookRunsBeforeRowsAreMarked: the post-publish hook runs for every
// acknowledged row before its batch is marked; a failing hook rolls the batch
// back and the rows are published (and hooked) again.
func TestHookRunsBeforeRowsAreMarked(t *testing.T) {
	t.Parallel()
	pg := migrated(t)
	pg.Exec(t, `INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a', 't', '{}' FROM generate_series(1, 30)`)
	h := &failingHook{fails: 3, seen: map[int64]int{}}
	cfg := testConfig(pg)
	cfg.BatchSize = 10
	r := start(t, cfg, Deps{NewProducer: func() (outbox.Producer, error) { return newFakeProducer(0, nil), nil },
		NewHook: func(context.Context) (outbox.Hook, error) { return h, nil }})
	waitCount(t, pg, "published_at IS NULL", 0, 30*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) != 30 {
		t.Fatalf("hook saw %d rows, want 30", len(h.seen))
	}
	if got := restarts(t, r.p.m, "hook"); got != 3 {
		t.Fatalf("%v restarts for the hook, want 3", got)
	}
}
