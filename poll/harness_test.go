package poll

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
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

func headers(m *sarama.ConsumerMessage) string {
	var b strings.Builder
	for _, h := range m.Headers {
		fmt.Fprintf(&b, "%s=%q ", h.Key, h.Value)
	}
	return b.String()
}
