package poll

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

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
	// A real logger: a CDC delivery that falls short must say why.
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named("cdc")
	svc := publisher.NewService(pcfg, log, nil, publisher.Deps{
		OpenSource: func(ctx context.Context) (publisher.Source, error) {
			return replication.Open(ctx, replication.StreamConfig{
				ConnString: pg.DSN, Slot: scfg.Slot, Publication: scfg.Publication,
				StatusInterval: 200 * time.Millisecond,
				Decoder:        replication.DecoderConfig{Columns: replication.DefaultColumns()},
			}, log)
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
