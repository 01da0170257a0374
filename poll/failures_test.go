package poll

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

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
	// Two restarts, not a fixed wait: under load 500 ms held only one.
	for deadline := time.Now().Add(30 * time.Second); restarts(t, r.p.m, "kafka") < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%v restarts after failures within 30 s, want ≥ 2", restarts(t, r.p.m, "kafka"))
		}
		time.Sleep(10 * time.Millisecond) // polling a metric with a deadline
	}
	if n := count(t, pg, "published_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d rows marked published while every produce failed", n)
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
