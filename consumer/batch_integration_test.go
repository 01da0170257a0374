package consumer

// Integration tests of batches (and of the per-partition concurrency they
// build on) against the real PostgreSQL and Kafka of the dev stack.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
)

// effectBatchHandler runs sh's script over the batch (failing at the first
// scripted failure) and then inserts all its outbox ids into effects with one
// statement, so a doubled effect fails the primary key.
func effectBatchHandler(sh *scriptHandler) BatchHandler {
	return BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, ms []*Message) error {
		if err := sh.HandleBatch(ctx, tx, ms); err != nil {
			return err
		}
		ids := make([]int64, len(ms))
		for i, m := range ms {
			ids[i] = m.OutboxID
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (outbox_id) SELECT unnest($1::bigint[])`, ids); err != nil {
			return fmt.Errorf("insert effects: %w", err)
		}
		return nil
	})
}

// The batch statements on a real database: one transaction records the ids,
// finds duplicates inside the batch and from before, counts them, and rolls
// back with the handler; on a quoted schema-qualified table too.
func TestStoreAttemptBatch(t *testing.T) {
	t.Parallel()
	pg, pool := newDB(t)
	ctx := context.Background()
	pg.Exec(t, `CREATE SCHEMA "Svc"`)
	if err := Migrate(ctx, pool, "Svc.Seen Ids"); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"processed_outbox_ids", "Svc.Seen Ids"} {
		t.Run(table, func(t *testing.T) {
			st, err := newPGStore(pool, table)
			if err != nil {
				t.Fatal(err)
			}
			ident, _ := tableIdent(table)
			sh := newScriptHandler()
			h := BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, ms []*Message) error {
				if err := sh.HandleBatch(ctx, tx, ms); err != nil {
					return err
				}
				// The dedup rows are there, in this transaction.
				var n int
				err := tx.QueryRow(ctx, `SELECT count(*) FROM `+ident.Sanitize()+` WHERE outbox_id = ANY($1)`, msgIDs(ms)).Scan(&n)
				if err == nil && n != len(ms) {
					err = fmt.Errorf("%d dedup rows visible to the handler, want %d", n, len(ms))
				}
				return err
			})
			batch := func(ids ...int64) []*Message {
				ms := make([]*Message, len(ids))
				for i, id := range ids {
					ms[i] = &Message{Topic: "t", Offset: int64(i), OutboxID: id}
				}
				return ms
			}

			sh.script[3] = []error{errFlaky}
			if _, err := st.attemptBatch(ctx, batch(1, 2, 3), h); !errors.Is(err, errFlaky) {
				t.Fatalf("failing batch: err %v", err)
			}
			if got := queryInts(t, pool, `SELECT count(*) FROM `+ident.Sanitize()); got[0] != 0 {
				t.Fatalf("%d dedup rows after a failed batch, want 0", got[0])
			}
			dup, err := st.attemptBatch(ctx, batch(1, 2, 1, 3, 2, 1), h)
			if err != nil || !slices.Equal(dup, []bool{false, false, true, false, true, true}) {
				t.Fatalf("batch with duplicates inside: dup %v, err %v", dup, err)
			}
			dup, err = st.attemptBatch(ctx, batch(4, 2, 5), h)
			if err != nil || !slices.Equal(dup, []bool{false, true, false}) {
				t.Fatalf("batch with a duplicate of the last: dup %v, err %v", dup, err)
			}
			if dup, err := st.attemptBatch(ctx, batch(5, 4), h); err != nil || !slices.Equal(dup, []bool{true, true}) {
				t.Fatalf("all duplicates: dup %v, err %v", dup, err)
			}
			if want := [][]int64{{1, 2, 3}, {1, 2, 3}, {4, 5}}; !slices.EqualFunc(sh.batches, want, slices.Equal) {
				t.Fatalf("handler batches %v, want %v (no call without a new message)", sh.batches, want)
			}
			got := queryInts(t, pool, `SELECT duplicates FROM `+ident.Sanitize()+` ORDER BY outbox_id`)
			if !slices.Equal(got, []int64{2, 2, 0, 1, 1}) {
				t.Fatalf("duplicates of ids 1..5: %v, want [2 2 0 1 1]", got)
			}
		})
	}
	missing, _ := newPGStore(pool, "missing_ids")
	_, err := missing.attemptBatch(ctx, []*Message{{OutboxID: 1}, {OutboxID: 2}}, BatchHandlerFunc(func(context.Context, pgx.Tx, []*Message) error { return nil }))
	if !errors.As(err, new(*dbError)) || !strings.Contains(err.Error(), "dedup table missing_ids missing") {
		t.Fatalf("batch without the dedup table: %v, want a database error saying how to create it", err)
	}
}

func msgIDs(ms []*Message) []int64 {
	ids := make([]int64, len(ms))
	for i, m := range ms {
		ids[i] = m.OutboxID
	}
	return ids
}

// Batches end to end: a batch with a duplicate inside commits as one; the
// next batch holds a duplicate of the first and a domain error in the
// middle, so it falls back to one message at a time: exactly that message
// is in the DLQ, every other is processed once, the committed offset covers
// everything.
func TestRunBatchPoison(t *testing.T) {
	t.Parallel()
	_, pool := newDB(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "cons_batch", 1)
	dlq := k.Topic(t, "cons_batch_dlq", 1)
	cfg := integrationConfig(k, topic)
	cfg.DeadLetterTopic = func(string) string { return dlq }
	// Everything is produced before the consumer starts: the batches are
	// offsets 0-4 and 5-9 (full) unless a fetch takes longer than BatchWait.
	cfg.BatchSize, cfg.BatchWait = 5, 5*time.Second

	sh := newScriptHandler()
	sh.always[6] = Domainf("invalid transition")
	produce(t, k, topic,
		rec{1, "a"}, rec{2, "b"}, rec{3, "c"}, rec{4, "d"}, rec{3, "c"}, // 4: duplicate inside the batch
		rec{2, "b"}, rec{5, "e"}, rec{6, "f"}, rec{7, "g"}, rec{8, "h"}, // 5: duplicate of the first batch; 7: poison
	)
	c, err := NewBatch(cfg, pool, effectBatchHandler(sh), zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- c.Run(ctx) }()
	r.waitDone(t, 10)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := c.Stats()
	if st.Processed != 7 || st.Duplicates != 2 || st.DeadLettered != 1 || st.Batches != 1 || st.BatchFallbacks != 1 {
		t.Fatalf("stats %+v, want processed 7, duplicates 2, dead-lettered 1, 1 batch, 1 fallback", st)
	}
	if want := [][]int64{{1, 2, 3, 4}, {5, 6, 7, 8}, {5}, {6}, {7}, {8}}; !slices.EqualFunc(sh.batches, want, slices.Equal) {
		t.Fatalf("handler calls %v, want %v", sh.batches, want)
	}
	if got := queryInts(t, pool, `SELECT outbox_id FROM effects ORDER BY 1`); !slices.Equal(got, []int64{1, 2, 3, 4, 5, 7, 8}) {
		t.Fatalf("effects %v, want [1 2 3 4 5 7 8]", got)
	}
	if got := queryInts(t, pool, `SELECT duplicates FROM processed_outbox_ids ORDER BY outbox_id`); !slices.Equal(got, []int64{0, 1, 1, 0, 0, 0, 0}) {
		t.Fatalf("duplicates of ids 1,2,3,4,5,7,8: %v, want [0 1 1 0 0 0 0] (the dead-lettered id 6 is not recorded)", got)
	}
	if off := committedOffset(t, k, cfg.GroupID, topic); off != 10 {
		t.Fatalf("committed offset %d, want 10", off)
	}
	got := k.ReadAll(t, dlq, 1, 30*time.Second)
	if len(got) != 1 {
		t.Fatalf("%d dead-letter records, want 1", len(got))
	}
	h := map[string]string{}
	for _, rh := range got[0].Headers {
		h[string(rh.Key)] = string(rh.Value)
	}
	if h[HeaderOutboxID] != "6" || h[HeaderSourceOffset] != "7" || h[HeaderErrorClass] != ClassDomain || h[HeaderAttempts] != "1" ||
		h[HeaderError] != "invalid transition" || string(got[0].Key) != "f" {
		t.Fatalf("dead-letter record key %q headers %v, want outbox id 6 from offset 7, domain, 1 attempt", got[0].Key, h)
	}
}

// Partitions are processed concurrently: sarama runs ConsumeClaim on its own
// goroutine per partition. The handler of each partition's message waits
// for the other's to start, which a consumer taking partitions in turn would
// never get to.
func TestRunPartitionsConcurrently(t *testing.T) {
	t.Parallel()
	_, pool := newDB(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "cons_parallel", 2)
	cfg := integrationConfig(k, topic)

	pc := k.Config()
	pc.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(k.Brokers, pc)
	if err != nil {
		t.Fatal(err)
	}
	for part := range int32(2) {
		id := fmt.Sprint(part + 1)
		_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: part, Value: sarama.StringEncoder("{}"),
			Headers: []sarama.RecordHeader{{Key: []byte(HeaderOutboxID), Value: []byte(id)}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	p.Close()

	var started, overlapped atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	h := HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if started.Add(1) >= 2 {
			once.Do(func() { close(both) })
		}
		select {
		case <-both:
			overlapped.Add(1)
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	r := start(t, cfg, pool, h)
	r.waitDone(t, 2)
	if n := overlapped.Load(); n != 2 {
		t.Fatalf("%d of 2 handler calls overlapped the other partition's: partitions are not processed concurrently", n)
	}
}
