package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/examples/internal/brew"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
	"github.com/outboxd/outboxd/migrations"
)

var bins map[string]string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() { // make unit: no server, no binary to build
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "statusconsumer-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err = testproc.Build(dir, "./examples/statusconsumer")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestValidTransition(t *testing.T) {
	t.Parallel()
	valid := map[[2]string]bool{
		{"created", "sent_to_establishment"}:   true,
		{"created", "cancelled"}:               true,
		{"sent_to_establishment", "accepted"}:  true,
		{"sent_to_establishment", "rejected"}:  true,
		{"sent_to_establishment", "cancelled"}: true,
		{"accepted", "completed"}:              true,
		{"accepted", "cancelled"}:              true,
	}
	for _, from := range brew.Statuses {
		for _, to := range brew.Statuses {
			if got := validTransition(from, to); got != valid[[2]string{from, to}] {
				t.Errorf("validTransition(%s, %s) = %v", from, to, got)
			}
		}
	}
}

// evt is an event to publish directly to a topic, as outboxd would.
type evt struct {
	outboxID int64
	payload  any
}

func createdEvt(id int64) brew.OrderCreated {
	return brew.OrderCreated{Type: brew.TypeOrderCreated, ID: id, Customer: "c", Amount: "12.50", Status: brew.StatusCreated}
}

func changed(id int64, status string) brew.StatusChanged {
	return brew.StatusChanged{Type: brew.TypeStatusChanged, ID: id, Status: status}
}

func publish(t *testing.T, k *testenv.KafkaEnv, topic string, evs ...evt) {
	t.Helper()
	p, err := sarama.NewSyncProducer(k.Brokers, k.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, e := range evs {
		v, _ := json.Marshal(e.payload)
		var head struct{ ID int64 }
		_ = json.Unmarshal(v, &head)
		key := brew.AggregateID(head.ID)
		_, _, err := p.SendMessage(&sarama.ProducerMessage{
			Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(v),
			Headers: []sarama.RecordHeader{
				{Key: []byte("outbox-id"), Value: []byte(strconv.FormatInt(e.outboxID, 10))},
				{Key: []byte("aggregate-id"), Value: []byte(key)},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func migratedPool(t *testing.T) (*testenv.PG, *pgxpool.Pool) {
	t.Helper()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(context.Background(), conn, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := brew.Migrate(context.Background(), conn, nil); err != nil {
		t.Fatalf("brew.Migrate: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pg, pool
}

func orderStatus(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id int64) (status string, events int) {
	t.Helper()
	if err := q.QueryRow(context.Background(), `SELECT status, events FROM order_status WHERE order_id = $1`, id).Scan(&status, &events); err != nil {
		t.Fatalf("order %d: %v", id, err)
	}
	return status, events
}

// The seed's end-to-end case: an invalid transition published to the status
// topic lands in the DLQ, the order's status is unchanged, and a valid
// transition with the same key right after it is processed. A status change
// for an order not projected yet (its order.created is on the other topic)
// is retried until it is.
func TestInvalidTransitionGoesToDLQ(t *testing.T) {
	t.Parallel()
	_, pool := migratedPool(t)
	k := testenv.Kafka(t)
	orders, status := k.Topic(t, "orders", 1), k.Topic(t, "status", 1)
	dlq := map[string]string{orders: k.Topic(t, "orders_dlq", 1), status: k.Topic(t, "status_dlq", 1)}

	cfg := consumer.DefaultConfig()
	cfg.Brokers, cfg.GroupID, cfg.Topics = k.Brokers, testenv.UniqueName("statusconsumer"), []string{orders, status}
	cfg.DeadLetterTopic = func(t string) string { return dlq[t] }
	cfg.BackoffBase, cfg.BackoffMax = 50*time.Millisecond, 400*time.Millisecond
	var (
		mu             sync.Mutex
		afterInvalid   string
		outcomes       = map[int64]consumer.Outcome{}
		statusSeenByID = map[int64]string{}
	)
	cfg.OnDone = func(m *consumer.Message, r consumer.Result) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[m.OutboxID] = r.Outcome
		var s string
		_ = pool.QueryRow(context.Background(), `SELECT status FROM order_status WHERE order_id = 1`).Scan(&s)
		statusSeenByID[m.OutboxID] = s
		if m.OutboxID == 3 {
			afterInvalid = s
		}
	}
	c, err := consumer.New(cfg, pool, projection{}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	publish(t, k, orders, evt{1, createdEvt(1)})
	publish(t, k, status,
		evt{2, changed(1, brew.StatusSentToEstablishment)},
		evt{3, changed(1, brew.StatusCompleted)}, // invalid: not accepted yet
		evt{4, changed(1, brew.StatusAccepted)},  // valid, same key, right after
		evt{5, changed(1, brew.StatusCompleted)},
		evt{6, changed(2, brew.StatusSentToEstablishment)}, // order 2 is not projected yet
	)
	deadline := time.Now().Add(60 * time.Second)
	for c.Stats().Retries == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no retry of the unknown order: %+v", c.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	publish(t, k, orders, evt{7, createdEvt(2)})
	for c.Stats().Done < 7 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 7 done", c.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}

	mu.Lock()
	defer mu.Unlock()
	if outcomes[3] != consumer.DeadLettered || afterInvalid != brew.StatusSentToEstablishment {
		t.Fatalf("invalid transition: outcome %v, status after it %q; want dead-lettered and still sent_to_establishment", outcomes[3], afterInvalid)
	}
	for _, id := range []int64{1, 2, 4, 5, 6, 7} {
		if outcomes[id] != consumer.Processed {
			t.Errorf("outbox id %d: %v, want processed", id, outcomes[id])
		}
	}
	if s := statusSeenByID[4]; s != brew.StatusAccepted {
		t.Errorf("after the valid transition right behind the invalid one: %q, want accepted", s)
	}
	if s, n := orderStatus(t, pool, 1); s != brew.StatusCompleted || n != 4 {
		t.Errorf("order 1: %s after %d events, want completed after 4", s, n)
	}
	if s, _ := orderStatus(t, pool, 2); s != brew.StatusSentToEstablishment {
		t.Errorf("order 2: %s, want sent_to_establishment (the retried change applied)", s)
	}
	got := k.ReadAll(t, dlq[status], 1, 30*time.Second)
	if len(got) != 1 {
		t.Fatalf("%d records in the status DLQ, want 1", len(got))
	}
	h := map[string]string{}
	for _, rh := range got[0].Headers {
		h[string(rh.Key)] = string(rh.Value)
	}
	if h["outbox-id"] != "3" || string(got[0].Key) != "order-1" || h[consumer.HeaderErrorClass] != consumer.ClassDomain ||
		h[consumer.HeaderError] != "invalid transition sent_to_establishment -> completed for order 1" ||
		h[consumer.HeaderSourceTopic] != status || h[consumer.HeaderSourceOffset] != "1" {
		t.Errorf("DLQ record key %q headers %v", got[0].Key, h)
	}
	if got := k.ReadAll(t, dlq[orders], 1, time.Second); len(got) != 0 {
		t.Errorf("%d records in the orders DLQ, want none", len(got))
	}
}

// The consumer is killed after its transaction committed and before the
// offset was committed: on restart the event is a DUP and its effect is not
// doubled.
func TestKillBetweenCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	pg, pool := migratedPool(t)
	k := testenv.Kafka(t)
	orders := k.Topic(t, "orders", 1)
	group := testenv.UniqueName("statusconsumer")
	publish(t, k, orders, evt{1, createdEvt(1)}, evt{2, createdEvt(2)})
	args := []string{"--pg-dsn", pg.DSN, "--kafka-brokers", strings.Join(k.Brokers, ","), "--topics", orders,
		"--group", group, "--commit-interval", "0", "--session-timeout", "6s", "--log-level", "info"}

	code, out := testproc.Run(t, 60*time.Second, bins["statusconsumer"], append(args, "--crash-after-commit", "1")...)
	if code != 3 || !strings.Contains(out, "INSERT outbox-id=1 order-1") || !strings.Contains(out, "CRASH after 1") {
		t.Fatalf("first run: exit %d, output:\n%s\nwant exit 3 after INSERT of outbox id 1", code, out)
	}
	if s, n := orderStatus(t, pool, 1); s != brew.StatusCreated || n != 1 {
		t.Fatalf("after the crash order 1 is %s (%d events), want created (1)", s, n)
	}

	p := testproc.Start(t, bins["statusconsumer"], args...)
	p.WaitOutput("INSERT outbox-id=2 order-2", 60*time.Second)
	if code := p.Stop(30 * time.Second); code != 0 {
		t.Fatalf("second run exited %d", code)
	}
	out = p.Output()
	if !strings.Contains(out, "DUP    outbox-id=1 order-1") || !strings.Contains(out, "processed=2 inserted=1 skipped=1 dlq=0") {
		t.Fatalf("second run output:\n%s\nwant outbox id 1 as DUP and processed=2 inserted=1 skipped=1 dlq=0", out)
	}
	for _, id := range []int64{1, 2} {
		if s, n := orderStatus(t, pool, id); s != brew.StatusCreated || n != 1 {
			t.Errorf("order %d: %s after %d events, want created after 1 (the effect once)", id, s, n)
		}
	}
	var rows, dups int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), sum(duplicates) FROM processed_outbox_ids`).Scan(&rows, &dups); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || dups != 1 {
		t.Errorf("processed_outbox_ids: %d rows, %d duplicates; want 2, 1", rows, dups)
	}
}

// The consumer takes the same Kafka security settings and flags as outboxd
// (package kafka): the example consumer reads through a SASL_SSL listener
// that also requires a client certificate.
func TestConsumesOverSASLSSLWithOutboxdsFlags(t *testing.T) {
	t.Parallel()
	pg, pool := migratedPool(t)
	ks := testenv.StartKafkaSASL(t)
	plain := &testenv.KafkaEnv{Brokers: ks.Brokers}
	orders := testenv.UniqueName("orders")
	admin, err := sarama.NewClusterAdmin(ks.Brokers, plain.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic(orders, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	publish(t, plain, orders, evt{1, createdEvt(1)})
	p := testproc.Start(t, bins["statusconsumer"], "--pg-dsn", pg.DSN, "--kafka-brokers", strings.Join(ks.TLSBrokers, ","),
		"--topics", orders, "--group", testenv.UniqueName("statusconsumer"), "--commit-interval", "0", "--log-level", "info",
		"--kafka-tls-ca-file", ks.CAFile, "--kafka-tls-cert-file", ks.ClientCertFile, "--kafka-tls-key-file", ks.ClientKeyFile,
		"--kafka-sasl-mechanism", "SCRAM-SHA-512", "--kafka-sasl-username", ks.User, "--kafka-sasl-password", ks.Password)
	p.WaitOutput("INSERT outbox-id=1 order-1", 90*time.Second)
	if code := p.Stop(30 * time.Second); code != 0 {
		t.Fatalf("statusconsumer exited %d:\n%s", code, p.Output())
	}
	if s, n := orderStatus(t, pool, 1); s != brew.StatusCreated || n != 1 {
		t.Errorf("order 1: %s after %d events, want created after 1", s, n)
	}
}
