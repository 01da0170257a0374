package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// stamp is when something happened, as nanoseconds since the run's clock
// base (one monotonic clock for the writer and the consumer).
type stamp = int64

// clock is the benchmark's single time base.
type clock struct{ base time.Time }

func (c clock) now() stamp { return int64(time.Since(c.base)) }

// written is one committed outbox row: its id, key, and when the commit
// returned to the writer.
type written struct {
	id     int64
	key    int32
	commit stamp
}

// writeLoad commits rows at rate events/s in transactions of txRows rows,
// from writers connections, for d. Each writer owns its aggregates (key k is
// written only by writer k % writers), so per key, commit order is id order
// — except with one aggregate (a hot aggregate), which every writer writes.
// Transaction j is due at start + j·txRows/rate; a writer that falls behind
// runs late transactions back to back (the achieved rate shows it).
func writeLoad(ctx context.Context, dsn string, clk clock, topic string, rate, txRows, writers, aggregates, payloadBytes int, d time.Duration) ([]written, error) {
	period := time.Duration(float64(time.Second) * float64(txRows) / float64(rate))
	var next atomic.Int64
	start := time.Now()
	end := start.Add(d)
	pad := strings.Repeat("x", max(0, payloadBytes-60))
	out := make([][]written, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[w], errs[w] = writer(ctx, dsn, clk, topic, w, writers, aggregates, txRows, pad, &next, start, end, period)
		}()
	}
	wg.Wait()
	var all []written
	for w := range writers {
		if errs[w] != nil {
			return nil, errs[w]
		}
		all = append(all, out[w]...)
	}
	return all, nil
}

const insertSQL = `INSERT INTO outbox (aggregate_id, topic, payload)
SELECT 'agg-' || k, $1, jsonb_build_object('k', k, 'n', n, 'pad', $2::text)
  FROM unnest($3::int[], $4::int[]) AS t(k, n) RETURNING id, (payload->>'k')::int`

func writer(ctx context.Context, dsn string, clk clock, topic string, w, writers, aggregates, txRows int, pad string,
	next *atomic.Int64, start, end time.Time, period time.Duration) ([]written, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("writer %d: %w", w, err)
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	perWriter := max(1, aggregates/writers)
	keys := make([]int32, txRows)
	ns := make([]int32, txRows)
	var out []written
	for {
		j := next.Add(1) - 1
		due := start.Add(time.Duration(j) * period)
		if !due.Before(end) {
			return out, nil
		}
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return out, ctx.Err()
			}
		}
		for i := range keys {
			keys[i] = int32(w + writers*rng.IntN(perWriter))
			if aggregates == 1 {
				keys[i] = 0 // a hot aggregate: every writer writes the one key
			}
			ns[i] = int32(j)
		}
		rows, err := conn.Query(ctx, insertSQL, topic, pad, keys, ns)
		if err != nil {
			return out, fmt.Errorf("writer %d: %w", w, err)
		}
		first := len(out)
		for rows.Next() {
			var wr written
			if err := rows.Scan(&wr.id, &wr.key); err != nil {
				rows.Close()
				return out, fmt.Errorf("writer %d: %w", w, err)
			}
			out = append(out, wr)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return out, fmt.Errorf("writer %d: %w", w, err)
		}
		// Autocommit: the statement's return is the commit's return.
		now := clk.now()
		for i := first; i < len(out); i++ {
			out[i].commit = now
		}
	}
}

// preload writes n rows in transactions of txRows rows as fast as it can,
// from two connections, without waiting for each commit to be flushed (the
// last transaction is synchronous, so all are flushed when it returns).
func preload(ctx context.Context, dsn, topic string, n, txRows, aggregates, payloadBytes int) error {
	pad := strings.Repeat("x", max(0, payloadBytes-60))
	const conns = 2
	txs := (n + txRows - 1) / txRows
	var next atomic.Int64
	errs := make(chan error, conns)
	for range conns {
		go func() {
			errs <- func() error {
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					return err
				}
				defer conn.Close(context.Background())
				if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
					return err
				}
				for {
					j := int(next.Add(1) - 1)
					if j >= txs {
						return nil
					}
					from, to := j*txRows, min(n, (j+1)*txRows)-1
					_, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload)
						SELECT 'agg-' || (g % $4), $1, jsonb_build_object('k', g % $4, 'n', g, 'pad', $2::text)
						  FROM generate_series($3::int, $5::int) g`, topic, pad, from, aggregates, to)
					if err != nil {
						return fmt.Errorf("preload: %w", err)
					}
				}
			}()
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			return err
		}
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT pg_current_wal_flush_lsn(), txid_current()") // a synchronous commit
	return err
}
