package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/examples/internal/brew"
	"github.com/outboxd/outboxd/examples/internal/democheck"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

var bins map[string]string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() { // make unit: no server, no binary to build
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err = testproc.Build(dir, "./cmd/outboxd", "./examples/democtl", "./examples/orderservice", "./examples/statusconsumer")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// The seed scenario of `make demo`, in a database, slot, topics and group of
// the test's own: 100 orders; outboxd crashes after Kafka acked the first
// batch, before confirming; it restarts; the consumer projects everything;
// status changes follow, 3 of them invalid. No event is lost, the
// duplicates are counted and skipped, and the projection holds each
// event's effect exactly once.
func TestCrashDemo(t *testing.T) {
	t.Parallel()
	const orders, invalid = 100, 3
	ctx := context.Background()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	ordersTopic, statusTopic := k.Topic(t, "brew_orders", 3), k.Topic(t, "brew_status", 3)
	dlqTopics := []string{ordersTopic + ".dlq", statusTopic + ".dlq"}
	createTopics(t, k, dlqTopics...) // the consumer's default names: <topic>.dlq
	slot, group := testenv.UniqueName("demo_slot"), testenv.UniqueName("statusconsumer")
	brokers := strings.Join(k.Brokers, ",")

	run := func(timeout time.Duration, bin string, args ...string) string {
		t.Helper()
		code, out := testproc.Run(t, timeout, bins[bin], args...)
		if code != 0 {
			t.Fatalf("%s %v: exit %d\n%s", bin, args, code, out)
		}
		return out
	}
	run(time.Minute, "outboxd", "migrate", "--pg-dsn", pg.DSN)
	run(time.Minute, "democtl", "migrate", "--pg-dsn", pg.DSN)
	run(time.Minute, "outboxd", "slot", "create", "--pg-dsn", pg.DSN, "--slot", slot, "--publication", slot)
	run(2*time.Minute, "orderservice", "--pg-dsn", pg.DSN, "--count", strconv.Itoa(orders),
		"--topic", ordersTopic, "--status-topic", statusTopic)

	outboxd := []string{"run", "--pg-dsn", pg.DSN, "--kafka-brokers", brokers, "--slot", slot, "--publication", slot,
		"--status-interval", "200ms", "--hook", ordersTopic + "=" + brew.SentHookSQL(statusTopic)}
	code, out := testproc.Run(t, 2*time.Minute, bins["outboxd"], append(outboxd, "--crash-after-produce", "30")...)
	if code != 3 {
		t.Fatalf("outboxd --crash-after-produce 30: exit %d, want 3\n%s", code, out)
	}
	conn := pg.Conn(t)
	client, admin := kafkaClients(t, k)
	ends, err := democheck.EndOffsets(client, ordersTopic)
	if err != nil {
		t.Fatal(err)
	}
	afterCrash := democheck.Sum(ends[ordersTopic])
	if afterCrash < 30 {
		t.Fatalf("%d records in Kafka after the crash, want ≥ 30 (acked before it)", afterCrash)
	}

	publisher := testproc.Start(t, bins["outboxd"], outboxd...)
	waitFor(t, "outbox pending = 0", func() (bool, string) {
		n, err := democheck.PendingOutbox(ctx, conn, slot, slot)
		return err == nil && n == 0, fmt.Sprintf("pending %d, err %v", n, err)
	})
	cons := testproc.Start(t, bins["statusconsumer"], "--pg-dsn", pg.DSN, "--kafka-brokers", brokers,
		// Short backoffs keep the test fast; the retries are many because a
		// status event can arrive before its order.created, read from the
		// other topic, is projected ("not projected yet", a transient
		// failure): on a loaded machine that lag passed the default five
		// retries of 20 ms to 200 ms once, and the event was dead-lettered.
		"--topics", ordersTopic+","+statusTopic, "--group", group, "--backoff-base", "20ms", "--backoff-max", "200ms", "--max-retries", "100")
	waitLag := func() {
		t.Helper()
		waitFor(t, "consumer lag = 0", func() (bool, string) {
			lag, err := democheck.Lag(client, admin, group, ordersTopic, statusTopic)
			return err == nil && lag == 0, fmt.Sprintf("lag %d, err %v", lag, err)
		})
	}
	waitLag()

	args := []string{"--pg-dsn", pg.DSN, "--topic", ordersTopic, "--status-topic", statusTopic}
	for _, c := range []string{"1=accepted", "1=completed", "2=accepted", "2=completed",
		"3=completed", "3=accepted", "3=completed", // invalid, then valid right after
		"4=completed", "4=accepted", "4=completed",
		"5=completed", "5=accepted", "5=completed",
		"6=rejected", "7=cancelled"} {
		args = append(args, "--set-status", c)
	}
	run(time.Minute, "orderservice", args...)
	waitFor(t, "outbox pending = 0", func() (bool, string) {
		n, err := democheck.PendingOutbox(ctx, conn, slot, slot)
		return err == nil && n == 0, fmt.Sprintf("pending %d, err %v", n, err)
	})
	waitLag()

	if code := cons.Stop(30 * time.Second); code != 0 {
		t.Fatalf("consumer exited %d after SIGTERM", code)
	}
	if code := publisher.Stop(60 * time.Second); code != 0 {
		t.Fatalf("outboxd exited %d after SIGTERM", code)
	}

	names := democheck.Names{Slot: slot, Publication: slot, OrdersTopic: ordersTopic, StatusTopic: statusTopic, DLQTopics: dlqTopics}
	counts, err := democheck.Collect(ctx, conn, client, names)
	if err != nil {
		t.Fatal(err)
	}
	var report strings.Builder
	ok := counts.Report(&report, names, orders, invalid)
	t.Logf("outboxd crashed with %d records in Kafka; the check:\n%s", afterCrash, report.String())
	if !ok {
		t.Fatalf("the demo's check failed")
	}
	if counts.Skipped == 0 {
		t.Errorf("no duplicates after a crash before confirming: the crash did not test anything")
	}

	// No event lost: every outbox row of either topic reached the consumer
	// and was applied, or dead-lettered (the invalid three).
	var unprocessed int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM outbox o LEFT JOIN processed_outbox_ids p ON p.outbox_id = o.id
		WHERE p.outbox_id IS NULL`).Scan(&unprocessed); err != nil {
		t.Fatal(err)
	}
	if unprocessed != invalid {
		t.Errorf("%d outbox rows not processed, want %d (the dead-lettered ones)", unprocessed, invalid)
	}
	// The effect once per event: each order's events counter equals its
	// applied events (created, sent, and the valid transitions).
	rows, _ := conn.Query(ctx, `SELECT s.events, (SELECT count(*) FROM processed_outbox_ids p JOIN outbox o ON o.id = p.outbox_id
		WHERE o.aggregate_id = 'order-' || s.order_id) FROM order_status s`)
	pairs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
		var p [2]int64
		return p, r.Scan(&p[0], &p[1])
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("an order applied %d events but %d were processed", p[0], p[1])
		}
	}

	// The consumer's own totals agree with Kafka: every record was done once.
	m := regexp.MustCompile(`processed=(\d+) inserted=(\d+) skipped=(\d+) dlq=(\d+)`).FindStringSubmatch(cons.Output())
	if m == nil {
		t.Fatalf("no totals in the consumer output")
	}
	done, _ := strconv.ParseInt(m[1], 10, 64)
	if want := counts.EndOffsets + counts.StatusEndOffsets; done != want {
		t.Errorf("consumer processed=%d, want every record of both topics (%d)", done, want)
	}
}

func createTopics(t *testing.T, k *testenv.KafkaEnv, names ...string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, n := range names {
		if err := admin.CreateTopic(n, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
			t.Fatalf("create topic %s: %v", n, err)
		}
		t.Cleanup(func() {
			a, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
			if err == nil {
				_ = a.DeleteTopic(n)
				_ = a.Close()
			}
		})
	}
}

func kafkaClients(t *testing.T, k *testenv.KafkaEnv) (sarama.Client, sarama.ClusterAdmin) {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.Config())
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() }) // closes the client too
	return client, admin
}

func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 2m: %s", what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
