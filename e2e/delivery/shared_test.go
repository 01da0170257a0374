package delivery

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// An exactly-once deployment idle for longer than the brokers'
// transactional.id.expiration.ms (lowered to 20 s): the coordinator forgets
// its transactional id, and the next event meets INVALID_PRODUCER_ID_MAPPING.
// That restarts the session (a new InitProducerId), never a "fenced" halt:
// the event is published once.
func TestRunExactlyOnceIdlePastTransactionalIDExpiration(t *testing.T) {
	t.Parallel()
	srv := testenv.StartKafkaWith(t, map[string]string{
		"transactional.id.expiration.ms":                             "20000",
		"transaction.remove.expired.transaction.cleanup.interval.ms": "1000",
	})
	k := &testenv.KafkaEnv{Brokers: srv.Brokers}
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: srv.Brokers, Topic: k.Topic(t, "idle", 1), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	// No idle checkpoint commits: they would keep the transactional id alive.
	args := e2e.EOSArgs("--checkpoint-interval", "1h", "--kafka-delivery-timeout", "5s", "--kafka-txn-timeout", "10s")
	d := e.Start(args...)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('agg-1', $1, '{"n": 1}')`, e.Topic)
	if v, n := e.Delivered(time.Minute); n != 1 || v.Lost != 0 || v.Duplicated != 0 {
		t.Fatalf("first event: %s", v)
	}
	idle := time.Now()
	e2e.WaitFor(t, 2*time.Minute, func() bool { return !hasTransactions(t, srv.Brokers) })
	t.Logf("transactional id forgotten after %s idle", time.Since(idle).Round(time.Second))
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('agg-1', $1, '{"n": 2}')`, e.Topic)
	v, n := e.Delivered(time.Minute)
	if n != 2 || v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 {
		t.Fatalf("after the expiry: %d events, %s", n, v)
	}
	if d.Exited() || strings.Contains(d.Out.String(), "fenced") {
		t.Fatalf("outboxd exited or called itself fenced; output:\n%s", d.P.Tail(30))
	}
	t.Logf("second event published after the expiry; restarts in the log: %d", strings.Count(d.Out.String(), "restarting pipeline"))
	d.Stop()
}

// hasTransactions reports whether the broker knows any transactional id.
func hasTransactions(t *testing.T, brokers []string) bool {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, b := range client.Brokers() {
		_ = b.Open(cfg)
		resp, err := b.ListTransactions(&sarama.ListTransactionsRequest{DurationFilter: -1})
		if err != nil {
			t.Fatalf("list transactions: %v", err)
		}
		if len(resp.TransactionStates) > 0 {
			return true
		}
	}
	return false
}
