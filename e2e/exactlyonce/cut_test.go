package exactlyonce

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
)

// The walsender ended while outboxd streams a big transaction — what a
// failover, a PostgreSQL restart or wal_sender_timeout does. In exactly-once
// mode the Kafka transaction holding the cut PostgreSQL transaction's rows is
// aborted, never committed: a read_committed reader sees every row once.
// OUTBOXD_TEST_CUT_ROWS sets the rows per transaction (default 20,000; the
// figure in docs/guarantees.md is from 150,000).
func TestRunExactlyOnceWalsenderEndedInsideATransaction(t *testing.T) {
	t.Parallel()
	rows := 20_000
	if s := os.Getenv("OUTBOXD_TEST_CUT_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			t.Fatalf("OUTBOXD_TEST_CUT_ROWS=%q: want a number ≥ 100", s)
		}
		rows = n
	}
	e := e2e.NewEnv(t, 3)
	d := e.Start(e2e.EOSArgs()...)
	offsets := newOffsetReader(t, e.Brokers, e.Topic)
	const rounds = 3
	cuts := 0
	for i := range rounds {
		before := offsets.sum()
		e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
			SELECT 'agg-' || (g % 50), $1, jsonb_build_object('round', $2::int, 'seq', g) FROM generate_series(1, $3::int) AS g`,
			e.Topic, i, rows)
		// Some of the transaction's records are in Kafka (in the open Kafka
		// transaction): end the walsender now.
		deadline := time.Now().Add(2 * time.Minute)
		for offsets.sum() < before+int64(rows)/5 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: a fifth of the %d rows did not reach the topic within 2 min", i, rows)
			}
			time.Sleep(2 * time.Millisecond) // polling the topic's end
		}
		e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot)
		if offsets.sum() < before+int64(rows) {
			cuts++ // not every record of the transaction was written yet
		}
		e.WaitConfirmed(2 * time.Minute)
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("exactly-once, %d transactions of %d rows, the walsender ended inside %d of them: %d events, %s; restarts %v",
		rounds, rows, cuts, n, v, d.Restarts())
	if cuts == 0 {
		t.Fatal("no walsender ended inside a transaction: the test did not test the cut (raise OUTBOXD_TEST_CUT_ROWS)")
	}
	if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("exactly-once with the walsender ended inside transactions: %s", v)
	}
	d.Stop()
}

// offsetReader sums a topic's end offsets over one client, fast enough to
// poll while a transaction streams.
type offsetReader struct {
	t     *testing.T
	c     sarama.Client
	topic string
	parts []int32
}

func newOffsetReader(t *testing.T, brokers []string, topic string) *offsetReader {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	c, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	parts, err := c.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	return &offsetReader{t: t, c: c, topic: topic, parts: parts}
}

func (o *offsetReader) sum() int64 {
	o.t.Helper()
	var n int64
	for _, p := range o.parts {
		off, err := o.c.GetOffset(o.topic, p, sarama.OffsetNewest)
		if err != nil {
			o.t.Fatalf("end offset of %s/%d: %v", o.topic, p, err)
		}
		n += off
	}
	return n
}
