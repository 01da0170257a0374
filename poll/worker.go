package poll

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// worker owns one connection and runs one polling transaction at a time.
type worker struct {
	p    *Poller
	conn *pgx.Conn
	tbl  *table
	prod outbox.Producer
	dlq  outbox.DeadLetterer
	hook outbox.Hook // nil: none
	// acks receives the worker's records back from the producer
	// (kafka.Record.Done): it holds BatchSize, so the producer never blocks.
	acks chan *kafka.Record
	// published is set once a batch of the session was published.
	published *atomic.Bool
	// unseen, on one worker of a session, notices rows deleted unpublished.
	unseen *unseenDeletes

	events []outbox.Event
	ids    []int64
}

func (w *worker) run(readCtx, hardCtx context.Context, first time.Duration) error {
	if !backoff.Sleep(readCtx, first) {
		return nil
	}
	for readCtx.Err() == nil {
		start := time.Now()
		n, err := w.batch(hardCtx)
		if err != nil {
			if readCtx.Err() != nil && hardCtx.Err() != nil {
				return nil // shutdown timeout: rolled back, not an error
			}
			return err
		}
		if n > 0 {
			w.published.Store(true)
		}
		w.unseen.check(readCtx, w.conn, w.tbl)
		if n == w.p.cfg.BatchSize {
			continue // a backlog: poll again at once
		}
		if !backoff.Sleep(readCtx, time.Until(start.Add(w.p.cfg.Interval))) {
			return nil
		}
	}
	return nil
}

// batch runs one polling transaction and returns the number of rows it
// published.
func (w *worker) batch(ctx context.Context) (n int, err error) {
	p := w.p
	began := time.Now()
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("poll: begin: %w", err)
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if err := w.read(ctx, tx); err != nil {
		return 0, err
	}
	if len(w.events) == 0 {
		p.m.Polls.WithLabelValues("empty").Inc()
		if err := tx.Commit(ctx); err != nil {
			return 0, fmt.Errorf("poll: commit: %w", err)
		}
		return 0, nil
	}

	if err := w.publish(ctx); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, w.tbl.updateSQL, w.ids); err != nil {
		return 0, fmt.Errorf("poll: mark published: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("poll: commit: %w", err)
	}
	n = len(w.events)
	outcome := "partial"
	if n == p.cfg.BatchSize {
		outcome = "full"
	}
	p.m.Polls.WithLabelValues(outcome).Inc()
	p.m.BatchSeconds.Observe(time.Since(began).Seconds())
	return n, nil
}

// publish produces the batch read (w.events) and waits until every record
// came back; the first failure is returned once all did (a shutdown timeout
// returns at once).
func (w *worker) publish(ctx context.Context) error {
	p := w.p
	now := time.Now()
	var (
		sent     int   // records handed to the producer or to acks
		outBytes int64 // bytes of those not back yet
		failed   error
	)
	p.m.InFlightEvents.Add(float64(len(w.events)))
	defer func() { // what never came back (a failure, a shutdown timeout)
		p.m.InFlightEvents.Sub(float64(sent))
		p.m.InFlightBytes.Sub(float64(outBytes))
	}()
	for i := range w.events {
		r := outbox.NewRecord(&w.events[i], &p.cfg.Mapping, now)
		var bad error // why the record is poison
		if r.Topic == "" {
			bad = errNoTopic
		} else if err := p.encode(ctx, r); errors.Is(err, kafka.ErrPoison) {
			bad = err // a payload that does not fit its schema
		} else if err != nil {
			failed = fmt.Errorf("poll: %w", err) // the registry: the batch rolls back, the session restarts
			break
		}
		size := int64(r.Size())
		if bad != nil {
			r.Err = &kafka.PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Size: int(size), Err: bad}
			w.acks <- r
		} else {
			r.Done = w.acks
			if err := w.prod.Send(ctx, r); err != nil {
				failed = fmt.Errorf("poll: produce: %w", err)
				break
			}
		}
		sent++
		outBytes += size
		p.m.InFlightBytes.Add(float64(size))
	}
	p.m.InFlightEvents.Sub(float64(len(w.events) - sent))
	// Wait for every record sent, even after a failure, so the producer
	// holds nothing of this batch when the session ends.
	for sent > 0 {
		var r *kafka.Record
		select {
		case r = <-w.acks:
		case <-ctx.Done():
			return ctx.Err()
		}
		size := int64(r.Size())
		sent--
		outBytes -= size
		p.m.InFlightEvents.Dec()
		p.m.InFlightBytes.Sub(float64(size))
		if failed != nil {
			continue // the batch rolls back: no hook, no dead letter
		}
		failed = w.result(ctx, r, int(size))
	}
	return failed
}

var errNoTopic = errors.New("the row has no topic and no --default-topic is set")

// Encoder writes a record in a wire format before it is produced
// (format.Encoder); an error matching kafka.ErrPoison makes the record
// poison (dead-lettered or halting), any other restarts the session.
type Encoder interface {
	Encode(ctx context.Context, r *kafka.Record) error
}

func (p *Poller) encode(ctx context.Context, r *kafka.Record) error {
	if p.cfg.Encoder == nil {
		return nil
	}
	return p.cfg.Encoder.Encode(ctx, r)
}

// result accounts for one record back from Kafka; poison goes to the
// dead-letter producer when there is one.
func (w *worker) result(ctx context.Context, r *kafka.Record, size int) error {
	p := w.p
	if r.Err == nil {
		if w.hook != nil {
			if err := w.hook.AfterPublish(ctx, r); err != nil {
				return err
			}
		}
		p.m.Published.WithLabelValues(r.Topic).Inc()
		p.m.PublishedBytes.WithLabelValues(r.Topic).Add(float64(size))
		p.m.LastEventTimestamp.SetToCurrentTime()
		if !r.Timestamp.IsZero() {
			p.m.CommitToAck.Observe(time.Since(r.Timestamp).Seconds())
		}
		return nil
	}
	if !errors.Is(r.Err, kafka.ErrPoison) || w.dlq == nil {
		p.m.ProduceErrors.WithLabelValues(r.Topic).Inc()
		return r.Err
	}
	if err := w.dlq.DeadLetter(ctx, r, r.Err); err != nil {
		return fmt.Errorf("poll: divert outbox id %d to dead-letter topic %q: %w", r.OutboxID, p.cfg.DeadLetterTopic, err)
	}
	p.log.Warn("poison event diverted to the dead-letter topic",
		zap.Int64("outbox_id", r.OutboxID), zap.String("topic", r.Topic),
		zap.String("dead_letter_topic", p.cfg.DeadLetterTopic), zap.Error(r.Err))
	p.m.DeadLettered.WithLabelValues(r.Topic).Inc()
	return nil
}

// read selects and locks the next batch into w.events and w.ids.
func (w *worker) read(ctx context.Context, tx pgx.Tx) error {
	w.events = w.events[:0]
	w.ids = w.ids[:0]
	rows, err := tx.Query(ctx, w.tbl.selectSQL, w.p.cfg.BatchSize)
	if err != nil {
		return fmt.Errorf("poll: select: %w", err)
	}
	if w.events, err = scanEvents(rows, w.tbl, w.events); err != nil {
		return err
	}
	for _, ev := range w.events {
		w.ids = append(w.ids, ev.ID)
	}
	return nil
}

// scanEvents reads the rows of a query of table.columnsSQL as events, as
// the pgoutput decoder would see them, and closes rows.
func scanEvents(rows pgx.Rows, tbl *table, events []outbox.Event) ([]outbox.Event, error) {
	defer rows.Close()
	var (
		id                    int64
		agg, topic, eventType pgtype.Text
		headers               pgtype.Text
		payload               []byte
		created               pgtype.Timestamptz
	)
	for rows.Next() {
		payload = nil
		if err := rows.Scan(&id, &agg, &payload, &topic, &created, &eventType, &headers); err != nil {
			return events, haltf(ErrBadRow, "outbox table %s: read a row: %v", tbl.plain, err)
		}
		if !agg.Valid || payload == nil {
			col := "aggregate_id"
			if agg.Valid {
				col = "payload"
			}
			return events, haltf(ErrBadRow, "outbox row id=%d: column %q is NULL", id, col)
		}
		ev := outbox.Event{ID: id, AggregateID: agg.String, Payload: payload,
			Topic: topic.String, EventType: eventType.String}
		if headers.Valid {
			var bad string
			if ev.Headers, bad = replication.AppendJSONHeaders(nil, []byte(headers.String), tbl.reserved); bad != "" {
				return events, haltf(ErrBadRow, "outbox row id=%d: column \"headers\" %s", id, bad)
			}
		}
		if created.Valid {
			if created.InfinityModifier != pgtype.Finite {
				return events, haltf(ErrBadRow, "outbox row id=%d: column \"created_at\" is infinite", id)
			}
			ev.CreatedAt = created.Time
		}
		events = append(events, ev)
	}
	if err := rows.Err(); err != nil {
		return events, fmt.Errorf("poll: select: %w", err)
	}
	return events, nil
}
