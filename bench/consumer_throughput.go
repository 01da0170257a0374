package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	// Aliased: this package has a type named consumer (consumer.go).
	outboxconsumer "github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/internal/testenv"
)

// consumerResult is one run of consumerThroughput.
type consumerResult struct {
	Partitions         int32   `json:"partitions"`
	Messages           int     `json:"messages"`
	BatchSize          int     `json:"batch_size"`
	Seconds            float64 `json:"seconds"`               // from Run's start until every message was processed
	MessagesPerSec     float64 `json:"messages_per_sec"`      // Messages / Seconds
	PerPartitionPerSec float64 `json:"per_partition_per_sec"` // MessagesPerSec / Partitions
	Err                string  `json:"err,omitempty"`
}

const (
	ctAggregates   = 1000 // keys agg-0 … agg-999, spread over the partitions by Kafka's hash
	ctPayloadBytes = 200  // size of each record's JSON value
	ctStall        = 2 * time.Minute
)

// consumerThroughput measures package consumer on the stack: it preloads a
// fresh topic of partitions partitions with messages records (outbox-id
// 1..messages), then runs one Consumer, whose handler inserts every message
// into a table, with cfg.BatchSize batchSize (1: consumer.New, today's one
// transaction per message; more: consumer.NewBatch with one INSERT … unnest
// per batch; BatchWait 0), and times it from Run's start (so including the
// group join, logged apart) until all messages are processed, i.e. the
// table holds messages rows. Everything it creates (database, topic) is
// removed before it returns.
func consumerThroughput(ctx context.Context, st stack, partitions int32, messages int, batchSize int, logf func(string, ...any)) (consumerResult, error) {
	res := consumerResult{Partitions: partitions, Messages: messages, BatchSize: batchSize}
	fail := func(err error) (consumerResult, error) {
		res.Err = err.Error()
		return res, err
	}
	if partitions < 1 || messages < 1 || batchSize < 1 {
		return fail(fmt.Errorf("consumer throughput: want partitions, messages and batch size ≥ 1, got %d, %d, %d", partitions, messages, batchSize))
	}

	db, err := createDatabase(ctx, st, "bench_consumer")
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := db.drop(); err != nil {
			logf("consumer throughput: %v", err)
		}
	}()
	topic, err := createTopic(st, "bench_consumer", partitions)
	if err != nil {
		return fail(err)
	}
	defer deleteTopic(st, topic)

	pcfg, err := pgxpool.ParseConfig(db.DSN)
	if err != nil {
		return fail(fmt.Errorf("consumer throughput: %w", err))
	}
	pcfg.MaxConns = partitions + 2 // a transaction per partition, and this function's queries
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fail(fmt.Errorf("consumer throughput: pool: %w", err))
	}
	defer pool.Close()
	cfg := outboxconsumer.DefaultConfig()
	if err := outboxconsumer.Migrate(ctx, pool, cfg.DedupTable); err != nil {
		return fail(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE consumed (outbox_id bigint PRIMARY KEY, v text NOT NULL)`); err != nil {
		return fail(fmt.Errorf("consumer throughput: create table consumed: %w", err))
	}

	t0 := time.Now()
	if err := ctPreload(st, topic, messages); err != nil {
		return fail(err)
	}
	logf("consumer throughput: %d records preloaded into %s (%d partitions) in %s", messages, topic, partitions, time.Since(t0).Round(time.Millisecond))

	cfg.Brokers = st.Brokers
	cfg.GroupID = testenv.UniqueName("bench_consumer")
	cfg.Topics = []string{topic}
	cfg.BatchSize = batchSize
	cfg.BatchWait = 0
	var start time.Time
	var firstDone atomic.Int64 // ns after start, 0 until the first message is done
	cfg.OnDone = func(*outboxconsumer.Message, outboxconsumer.Result) {
		if firstDone.Load() == 0 {
			firstDone.CompareAndSwap(0, int64(time.Since(start)))
		}
	}
	var c *outboxconsumer.Consumer
	if batchSize == 1 {
		c, err = outboxconsumer.New(cfg, pool, outboxconsumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *outboxconsumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO consumed (outbox_id, v) VALUES ($1, $2)`, m.OutboxID, string(m.Value))
			return err
		}), nil)
	} else {
		c, err = outboxconsumer.NewBatch(cfg, pool, outboxconsumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, ms []*outboxconsumer.Message) error {
			ids, vs := make([]int64, len(ms)), make([]string, len(ms))
			for i, m := range ms {
				ids[i], vs[i] = m.OutboxID, string(m.Value)
			}
			_, err := tx.Exec(ctx, `INSERT INTO consumed (outbox_id, v) SELECT * FROM unnest($1::bigint[], $2::text[])`, ids, vs)
			return err
		}), nil)
	}
	if err != nil {
		return fail(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start = time.Now()
	go func() { errc <- c.Run(runCtx) }()
	stopRun := func() error {
		stop()
		select {
		case err := <-errc:
			return err
		case <-time.After(60 * time.Second):
			return errors.New("consumer throughput: Run did not return within 60s of its cancel")
		}
	}

	// Processed counts a message after its transaction committed: it
	// reaches messages when the table holds messages rows (checked below).
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var last int64
	lastProgress := time.Now()
	for {
		s := c.Stats()
		if s.Processed >= int64(messages) {
			break
		}
		if s.DeadLettered > 0 || s.Duplicates > 0 {
			_ = stopRun()
			return fail(fmt.Errorf("consumer throughput: %+v: want every message processed once", s))
		}
		if s.Done != last {
			last, lastProgress = s.Done, time.Now()
		} else if time.Since(lastProgress) > ctStall {
			_ = stopRun()
			return fail(fmt.Errorf("consumer throughput: no progress for %s at %+v", ctStall, s))
		}
		select {
		case err := <-errc:
			return fail(fmt.Errorf("consumer throughput: Run returned early: %v", err))
		case <-ctx.Done():
			_ = stopRun()
			return fail(ctx.Err())
		case <-tick.C:
		}
	}
	elapsed := time.Since(start)
	stats := c.Stats()
	if err := stopRun(); err != nil {
		return fail(err)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM consumed`).Scan(&rows); err != nil {
		return fail(fmt.Errorf("consumer throughput: count consumed: %w", err))
	}
	if rows != messages {
		return fail(fmt.Errorf("consumer throughput: consumed holds %d rows, want %d", rows, messages))
	}

	res.Seconds = elapsed.Seconds()
	res.MessagesPerSec = float64(messages) / res.Seconds
	res.PerPartitionPerSec = res.MessagesPerSec / float64(partitions)
	first := time.Duration(firstDone.Load())
	logf("consumer throughput: %d partitions, batch %d: %d messages in %.2fs = %.0f msg/s (%.0f per partition); first message done %s after Run (join, fetch); %d batch transactions, %d fallbacks",
		partitions, batchSize, messages, res.Seconds, res.MessagesPerSec, res.PerPartitionPerSec, first.Round(time.Millisecond), stats.Batches, stats.BatchFallbacks)
	return res, nil
}

// ctPreload produces n records to topic: header outbox-id 1..n, keys over
// ctAggregates aggregates, ctPayloadBytes of JSON each.
func ctPreload(st stack, topic string, n int) error {
	sc := kafkaConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(st.Brokers, sc)
	if err != nil {
		return fmt.Errorf("consumer throughput: producer: %w", err)
	}
	defer p.Close()
	const chunk = 1000
	batch := make([]*sarama.ProducerMessage, 0, chunk)
	for id := 1; id <= n; id++ {
		agg := "agg-" + strconv.Itoa(id%ctAggregates)
		v := fmt.Sprintf(`{"aggregate_id":%q,"outbox_id":%d,"type":"order.status_changed","status":"preparing","pad":""}`, agg, id)
		v = v[:len(v)-2] + strings.Repeat("x", max(0, ctPayloadBytes-len(v))) + `"}`
		batch = append(batch, &sarama.ProducerMessage{
			Topic:   topic,
			Key:     sarama.StringEncoder(agg),
			Value:   sarama.StringEncoder(v),
			Headers: []sarama.RecordHeader{{Key: []byte(outboxconsumer.HeaderOutboxID), Value: []byte(strconv.Itoa(id))}},
		})
		if len(batch) == chunk || id == n {
			if err := p.SendMessages(batch); err != nil {
				return fmt.Errorf("consumer throughput: preload: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}
