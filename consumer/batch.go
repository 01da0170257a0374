package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// BatchHandler processes several events of one partition in one transaction
// ([NewBatch], [Config.BatchSize]).
//
// HandleBatch runs inside tx, the transaction that also records the outbox
// ids of all the batch's messages as processed, duplicates included. It must
// do its writes through tx and must not commit or roll it back. ms is never
// empty; its messages are from one partition, in offset order, each with a
// distinct outbox id not processed before (duplicates are left out and
// counted). ctx carries a message's trace context ([TraceContextFrom]) only
// when ms has one element; otherwise read each message's with
// [HeaderCarrier].
//
// Returning an error, or panicking, rolls the whole batch back (dedup rows
// included), and the consumer redoes its messages one at a time, calling
// HandleBatch with a one-element slice for each, in a transaction of its
// own. Only then is an error classified, as for a [Handler]: wrapped with
// [Domain] it sends that one message to the dead-letter topic, any other is
// retried up to [Config.MaxRetries] times. So a failing message never fails
// or dead-letters its batch neighbours, and the error of a call with several
// messages may be returned at the first failure, with no need to say which
// message failed. The failed batch call does not count as an attempt of its
// messages. HandleBatch must therefore give the same result for a message
// alone as in a batch, and must not rely on side effects outside tx.
type BatchHandler interface {
	HandleBatch(ctx context.Context, tx pgx.Tx, ms []*Message) error
}

// BatchHandlerFunc adapts a function to [BatchHandler].
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, ms []*Message) error

// HandleBatch calls f.
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*Message) error {
	return f(ctx, tx, ms)
}

// perMessage is the batch path of a Handler ([New] with BatchSize > 1):
// Handle for each message in turn, each with its own trace context.
type perMessage struct{ h Handler }

func (a perMessage) HandleBatch(ctx context.Context, tx pgx.Tx, ms []*Message) error {
	for _, m := range ms {
		if err := a.h.Handle(handlerContext(ctx, m), tx, m); err != nil {
			return err
		}
	}
	return nil
}

// batchOfOne is the single-message path of a BatchHandler ([NewBatch]): a
// one-element batch.
type batchOfOne struct{ bh BatchHandler }

func (a batchOfOne) Handle(ctx context.Context, tx pgx.Tx, m *Message) error {
	return a.bh.HandleBatch(ctx, tx, []*Message{m})
}

// callBatchHandler runs h, turning a panic into a domain error.
func callBatchHandler(ctx context.Context, h BatchHandler, tx pgx.Tx, ms []*Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Domainf("handler panicked: %v", r)
		}
	}()
	return h.HandleBatch(ctx, tx, ms)
}

// processBatch does ms (messages of one partition in offset order, each
// with a valid outbox id) in one transaction: their dedup rows, the
// duplicate counts and the batch handler with the new ones. When it returns
// nil every message is done (Processed or Duplicate, at attempt 1) and res
// holds their results in order. When it returns an error nothing of the
// batch happened (it rolled back) and none of its messages is done: the
// caller processes them one at a time. The attempt is not retried here.
func (p *processor) processBatch(ctx context.Context, ms []*Message) (res []Result, err error) {
	for _, m := range ms {
		m.Attempt = 1
	}
	dup, err := p.store.attemptBatch(ctx, ms, p.bh)
	if err != nil {
		return nil, err
	}
	res = make([]Result, len(ms))
	for i := range ms {
		res[i] = Result{Outcome: Processed, Attempts: 1}
		if dup[i] {
			res[i].Outcome = Duplicate
		}
	}
	return res, nil
}

// dedupKey is a dedup row's key: origin and event id.
type dedupKey struct {
	Origin, EventID string
}

// attemptBatch is attempt for several messages: one transaction records all
// their outbox ids with one statement, counts the duplicates (an id already
// processed, or met earlier in ms) with another, runs h with the new
// messages, and commits. dup[i] tells whether ms[i] was a duplicate. On any
// error the transaction is rolled back (or, when the commit got no answer,
// its outcome is unknown: the one-at-a-time pass that follows finds the
// committed ids as duplicates).
func (s *pgStore) attemptBatch(ctx context.Context, ms []*Message, h BatchHandler) (dup []bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, &dbError{op: "begin", err: err}
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	origins, eventIDs := make([]string, len(ms)), make([]string, len(ms))
	ids, topics := make([]int64, len(ms)), make([]string, len(ms))
	for i, m := range ms {
		origins[i], eventIDs[i], ids[i], topics[i] = m.Origin, m.dedupID(), m.OutboxID, m.Topic
	}
	rows, _ := tx.Query(ctx, s.insertBatchSQL, origins, eventIDs, ids, topics)
	inserted, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dedupKey])
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
			return nil, &dbError{op: fmt.Sprintf("record %d outbox ids: dedup table %s missing: create it with consumer.Migrate or consumer.SchemaSQL (outboxd migrate does not)", len(ids), s.table), err: err}
		}
		return nil, &dbError{op: fmt.Sprintf("record %d outbox ids", len(ids)), err: err}
	}
	isNew := make(map[dedupKey]bool, len(inserted))
	for _, k := range inserted {
		isNew[k] = true
	}
	dup = make([]bool, len(ms))
	fresh := make([]*Message, 0, len(inserted))
	var dupOrigins, dupIDs []string
	for i, m := range ms {
		k := dedupKey{m.Origin, m.dedupID()}
		if isNew[k] {
			isNew[k] = false // a later message with this id is a duplicate
			fresh = append(fresh, m)
			continue
		}
		dup[i] = true
		dupOrigins, dupIDs = append(dupOrigins, m.Origin), append(dupIDs, m.dedupID())
	}
	if len(dupIDs) > 0 {
		if _, err := tx.Exec(ctx, s.dupBatchSQL, dupOrigins, dupIDs); err != nil {
			return nil, &dbError{op: fmt.Sprintf("count %d duplicates", len(dupIDs)), err: err}
		}
	}
	if len(fresh) > 0 {
		if err := callBatchHandler(ctx, h, tx, fresh); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, commitError(err)
	}
	committed = true
	return dup, nil
}

// messageBytes is what a fetched message holds: key, value and headers.
func messageBytes(m *sarama.ConsumerMessage) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
