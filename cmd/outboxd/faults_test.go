package main

import (
	"context"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Helpers shared by the Kafka fault tests (this file and cluster_test.go).

var restartCauseRE = regexp.MustCompile(`restarting pipeline[^\n]*"cause": "([a-z]+)"`)

// restarts counts the pipeline restarts outboxd logged, by cause.
func (d *Daemon) restarts() map[string]int {
	out := map[string]int{}
	for _, m := range restartCauseRE.FindAllStringSubmatch(d.Out.String(), -1) {
		out[m[1]]++
	}
	return out
}

// endOffsets is the sum of topic's partitions' end offsets: how many
// records Kafka holds. -1 when the brokers cannot answer.
func endOffsets(brokers []string, topic string) int64 {
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

// probe produces one record to topic with acks=all and reports whether
// Kafka accepted it: the test's own view of "the broker accepts produce
// again", independent of outboxd.
func probe(brokers []string, topic string) bool {
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

// recovery measures, after a fault ended, how long outboxd took to publish
// again once Kafka accepted a probe's produce: (accepted, published).
// Rows must still be written meanwhile.
func recovery(t *testing.T, brokers []string, topic, probeTopic string, timeout time.Duration) (accepted, published time.Time) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !probe(brokers, probeTopic) {
		if time.Now().After(deadline) {
			t.Fatalf("Kafka did not accept a produce within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	accepted = time.Now()
	base := endOffsets(brokers, topic)
	for base < 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		base = endOffsets(brokers, topic)
	}
	for {
		if n := endOffsets(brokers, topic); n > base && base >= 0 {
			return accepted, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("outboxd did not publish within %s after Kafka accepted produce again", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outboxRows is how many rows the test's outbox holds now.
func (e *Env) outboxRows() int64 {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var n int64
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		e.T.Fatal(err)
	}
	return n
}

// steady is the fault tests' load: single-row transactions at about rate
// events/s over 50 aggregates, until ctx ends.
func (e *Env) steady(ctx context.Context, rate int) <-chan error {
	done := make(chan error, 1)
	go func() {
		const writers = 3
		err := e.Write(ctx, Load{Writers: writers, Aggregates: 50, Total: 10_000_000, MaxTxn: 1,
			Pause: time.Duration(writers) * time.Second / time.Duration(rate)})
		if ctx.Err() != nil {
			err = nil
		}
		e.settle()
		done <- err
	}()
	return done
}

// settle waits until no writer's INSERT still runs in the test's database:
// a writer cancelled mid-statement returns at once, but its backend may
// commit the row a moment later, after the rows were read.
func (e *Env) settle() {
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

// backlog writes n rows over 200 aggregates in transactions of 1,000 rows,
// in one session, so per key commit order is id order.
func (e *Env) backlog(n int) {
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

// The wedge: a backlog fills the in-flight window, Kafka stops
// for 20 s mid-drain. Before the fix, outboxd published nothing more after
// Kafka came back, without a word. Now the producer retries in place and,
// past --kafka-delivery-timeout, the session restarts from the confirmed
// position; everything arrives in per-key order and the process never exits.
func TestRunBacklogSurvivesKafkaStoppedMidDrain(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("wedge"), Slot: testenv.UniqueName("slot")}
	createTopic(t, ks.Brokers, e.Topic, 6)
	e.Migrate()
	// The slot must exist before the backlog is written, or it starts after it.
	d := e.Start("--kafka-delivery-timeout", "5s")
	d.Stop()
	const rows = 200_000
	e.backlog(rows)
	d = StartDaemon(t, e.Args("--kafka-delivery-timeout", "5s")...)
	waitFor(t, 3*time.Minute, func() bool { return endOffsets(ks.Brokers, e.Topic) >= 40_000 })
	ks.Stop()
	stopped := time.Now()
	for time.Since(stopped) < 20*time.Second {
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) while Kafka was down", d.Code)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ks.Start()
	v, n := e.Delivered(5 * time.Minute)
	r := d.restarts()
	t.Logf("%d-row backlog, Kafka stopped 20 s mid-drain: %s; restarts %v", n, v, r)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != rows {
		t.Fatalf("after Kafka stopped mid-drain: %s (%d rows)", v, n)
	}
	if d.Exited() {
		t.Fatalf("outboxd exited (%d)", d.Code)
	}
	if r["kafka"] == 0 {
		t.Errorf("no restart with cause kafka was logged: the 20 s outage outlasted --kafka-delivery-timeout 5s")
	}
	d.Stop()
}

// Ten 10 s broker outages under 300 events/s. Before the fix a
// record that failed at the broker's return was appended after a later
// record of its aggregate (525 reorders). Now no first delivery is out of
// commit order, and outboxd publishes again soon after Kafka accepts
// produce.
func TestRunTenShortKafkaOutagesKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("outages"), Slot: testenv.UniqueName("slot")}
	createTopic(t, ks.Brokers, e.Topic, 6)
	probeTopic := testenv.UniqueName("probe")
	createTopic(t, ks.Brokers, probeTopic, 1)
	e.Migrate()
	d := e.Start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.steady(ctx, 300)
	waitFor(t, time.Minute, func() bool { return endOffsets(ks.Brokers, e.Topic) > 300 })
	var stalls []string
	var longest time.Duration
	for i := 0; i < 10; i++ {
		ks.Stop()
		down := time.Now()
		for time.Since(down) < 10*time.Second {
			if d.Exited() {
				t.Fatalf("outage %d: outboxd exited (%d)", i+1, d.Code)
			}
			time.Sleep(100 * time.Millisecond)
		}
		ks.Start()
		accepted, published := recovery(t, ks.Brokers, e.Topic, probeTopic, 2*time.Minute)
		took := published.Sub(accepted)
		longest = max(longest, took)
		stalls = append(stalls, took.Round(time.Millisecond).String())
		// Publishing between outages: the next one starts only once
		// outboxd has published what was written while Kafka was away, so
		// it hits a pipeline in steady state again (a fixed 3 s did not
		// say whether the drain was over).
		rows := e.outboxRows()
		waitFor(t, time.Minute, func() bool {
			if d.Exited() {
				t.Fatalf("after outage %d: outboxd exited (%d)", i+1, d.Code)
			}
			return endOffsets(ks.Brokers, e.Topic) >= rows
		})
	}
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("10 outages of 10 s under 300 ev/s, %d events: %s; Kafka accepts → outboxd publishes, per outage: %s (longest %s); restarts %v",
		n, v, strings.Join(stalls, " "), longest.Round(time.Millisecond), d.restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after 10 short outages: %s", v)
	}
	if longest > 10*time.Second {
		t.Errorf("outboxd published again only %s after Kafka accepted produce (target ≤ 2 s)", longest)
	}
	d.Stop()
}

// A silent server: the walsender is frozen (SIGSTOP) — the TCP
// connection stays open but nothing comes, not even the keepalive outboxd
// asks for. The watchdog restarts the session after --server-timeout
// (cause postgres); once the walsender is gone the new session streams and
// nothing is lost.
func TestRunRestartsWhenTheWalsenderFreezes(t *testing.T) {
	t.Parallel()
	e := NewEnv(t, 3)
	d := e.Start("--server-timeout", "4s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.steady(ctx, 300)
	waitFor(t, time.Minute, func() bool { return endOffsets(e.Brokers, e.Topic) > 300 })
	var pid int
	c := e.Conn()
	if err := c.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, e.Slot).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	c.Close(context.Background())
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	frozen := time.Now()
	d.WaitLog("replication server silent", 30*time.Second)
	t.Logf("watchdog fired %s after the walsender froze (--server-timeout 4s)", time.Since(frozen).Round(100*time.Millisecond))
	// The frozen walsender still holds the slot: terminate it, as the server
	// would once wal_sender_timeout passed, and let it go.
	e.Exec(`SELECT pg_terminate_backend($1)`, pid)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	waitFor(t, time.Minute, func() bool { return strings.Count(d.Out.String(), "streaming") >= 2 })
	time.Sleep(2 * time.Second)
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("walsender frozen under 300 ev/s, %d events: %s; restarts %v", n, v, d.restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after a frozen walsender: %s", v)
	}
	if d.restarts()["postgres"] == 0 {
		t.Errorf("no restart with cause postgres")
	}
	d.Stop()
}
