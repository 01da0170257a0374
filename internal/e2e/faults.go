package e2e

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// Kafka faults: what Kafka holds, whether it accepts produce, how soon
// outboxd publishes again, and the load the fault tests write.

var restartCauseRE = regexp.MustCompile(`restarting pipeline[^\n]*"cause": "([a-z]+)"`)

// Restarts counts the pipeline restarts outboxd logged, by cause.
func (d *Daemon) Restarts() map[string]int {
	out := map[string]int{}
	for _, m := range restartCauseRE.FindAllStringSubmatch(d.Out.String(), -1) {
		out[m[1]]++
	}
	return out
}

// EndOffsets is the sum of topic's partitions' end offsets: how many
// records Kafka holds. -1 when the brokers cannot answer.
func EndOffsets(brokers []string, topic string) int64 {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 3 * time.Second
	cfg.Metadata.Retry.Max = 0
	c, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return -1
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		return -1
	}
	var n int64
	for _, p := range parts {
		off, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return -1
		}
		n += off
	}
	return n
}

// Probe produces one record to topic with acks=all and reports whether
// Kafka accepted it: the test's own view of "the broker accepts produce
// again", independent of outboxd.
func Probe(brokers []string, topic string) bool {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 3 * time.Second
	cfg.Metadata.Retry.Max = 0
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = 0
	cfg.Producer.Timeout = 2 * time.Second
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return false
	}
	defer p.Close()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("probe")})
	return err == nil
}

// Recovery measures, after a fault ended, how long outboxd took to publish
// again once Kafka accepted a probe's produce: (accepted, published).
// Rows must still be written meanwhile.
func Recovery(t *testing.T, brokers []string, topic, probeTopic string, timeout time.Duration) (accepted, published time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !Probe(brokers, probeTopic) {
		if time.Now().After(deadline) {
			t.Fatalf("Kafka did not accept a produce within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	accepted = time.Now()
	base := EndOffsets(brokers, topic)
	for base < 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		base = EndOffsets(brokers, topic)
	}
	for {
		if n := EndOffsets(brokers, topic); n > base && base >= 0 {
			return accepted, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("outboxd did not publish within %s after Kafka accepted produce again", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OutboxRows is how many rows the test's outbox holds now.
func (e *Env) OutboxRows() int64 {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var n int64
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		e.T.Fatal(err)
	}
	return n
}

// Steady is the fault tests' load: single-row transactions at about rate
// events/s over 50 aggregates, until ctx ends.
func (e *Env) Steady(ctx context.Context, rate int) <-chan error {
	done := make(chan error, 1)
	go func() {
		const writers = 3
		err := e.Write(ctx, Load{Writers: writers, Aggregates: 50, Total: 10_000_000, MaxTxn: 1,
			Pause: time.Duration(writers) * time.Second / time.Duration(rate)})
		if ctx.Err() != nil {
			err = nil
		}
		e.Settle()
		done <- err
	}()
	return done
}

// Settle waits until no writer's INSERT still runs in the test's database:
// a writer cancelled mid-statement returns at once, but its backend may
// commit the row a moment later, after the rows were read.
func (e *Env) Settle() {
	c, err := pgx.Connect(context.Background(), e.DSN)
	if err != nil {
		return // the check is best effort: delivered reads the rows anyway
	}
	defer c.Close(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := c.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			AND state <> 'idle' AND query ILIKE 'INSERT INTO outbox%'`).Scan(&n)
		if err == nil && n == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Backlog writes n rows over 200 aggregates in transactions of 1,000 rows,
// in one session, so per key commit order is id order.
func (e *Env) Backlog(n int) {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	for done := 0; done < n; done += 1000 {
		_, err := c.Exec(context.Background(), `INSERT INTO outbox (aggregate_id, topic, payload)
			SELECT 'agg-' || (g % 200), $1, jsonb_build_object('seq', g)
			FROM generate_series($2::int, $3::int) AS g ORDER BY g`, e.Topic, done, min(done+1000, n)-1)
		if err != nil {
			e.T.Fatal(err)
		}
	}
}

// WaitPublishing waits, bounded by timeout, until the test's topic holds n
// more offsets than now (records and, exactly-once, transaction markers):
// the sign that outboxd publishes the load being written, where a fixed
// sleep only hoped it did.
func (e *Env) WaitPublishing(n int64, timeout time.Duration) {
	e.T.Helper()
	base := int64(-1)
	WaitFor(e.T, timeout, func() bool { base = EndOffsets(e.Brokers, e.Topic); return base >= 0 })
	WaitFor(e.T, timeout, func() bool { return EndOffsets(e.Brokers, e.Topic) >= base+n })
}
