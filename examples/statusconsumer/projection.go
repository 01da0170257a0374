package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/consumer"
	"github.com/outboxd/outboxd/examples/internal/brew"
)

// next lists the statuses an order may move to from each status. Completed,
// rejected and cancelled are final.
var next = map[string][]string{
	brew.StatusCreated:             {brew.StatusSentToEstablishment, brew.StatusCancelled},
	brew.StatusSentToEstablishment: {brew.StatusAccepted, brew.StatusRejected, brew.StatusCancelled},
	brew.StatusAccepted:            {brew.StatusCompleted, brew.StatusCancelled},
}

// validTransition reports whether an order may move from one status to another.
func validTransition(from, to string) bool { return slices.Contains(next[from], to) }

// errUnknownOrder means a status change arrived for an order the projection
// does not hold yet. Order events and status events travel on different
// topics, so the order.created event may simply not be processed yet: the
// error is transient, and retried.
var errUnknownOrder = errors.New("order not projected yet")

// projection keeps order_status: one row per order, moved along the state
// machine. It is a consumer.Handler: every write goes through the
// consumer's transaction, so the projection and the dedup row commit
// together.
type projection struct{}

// Handle applies one event. Malformed events, a key that does not match the
// order, an order created twice and invalid transitions are domain errors.
func (projection) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var head struct {
		Type string `json:"type"`
		ID   int64  `json:"id"`
	}
	if err := json.Unmarshal(m.Value, &head); err != nil {
		return consumer.Domainf("payload is not an event: %w", err)
	}
	if key := string(m.Key); key != brew.AggregateID(head.ID) {
		return consumer.Domainf("key %q does not match order %d", key, head.ID)
	}
	switch head.Type {
	case brew.TypeOrderCreated:
		var ev brew.OrderCreated
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return consumer.Domainf("%s: %w", head.Type, err)
		}
		return created(ctx, tx, m.OutboxID, ev)
	case brew.TypeStatusChanged:
		var ev brew.StatusChanged
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return consumer.Domainf("%s: %w", head.Type, err)
		}
		return statusChanged(ctx, tx, m.OutboxID, ev)
	}
	return consumer.Domainf("unknown event type %q", head.Type)
}

func created(ctx context.Context, tx pgx.Tx, outboxID int64, ev brew.OrderCreated) error {
	if !brew.KnownStatus(ev.Status) {
		return consumer.Domainf("order %d created with unknown status %q", ev.ID, ev.Status)
	}
	tag, err := tx.Exec(ctx, `
		INSERT INTO order_status (order_id, customer, amount, status, last_outbox_id)
		VALUES ($1, $2, $3::numeric, $4, $5)
		ON CONFLICT (order_id) DO NOTHING`, ev.ID, ev.Customer, ev.Amount, ev.Status, outboxID)
	if err != nil {
		return fmt.Errorf("project order %d: %w", ev.ID, err)
	}
	if tag.RowsAffected() == 0 {
		// Not a redelivery (the consumer skips those): another event
		// created the same order.
		return consumer.Domainf("order %d is already projected", ev.ID)
	}
	return nil
}

func statusChanged(ctx context.Context, tx pgx.Tx, outboxID int64, ev brew.StatusChanged) error {
	var from string
	err := tx.QueryRow(ctx, `SELECT status FROM order_status WHERE order_id = $1 FOR UPDATE`, ev.ID).Scan(&from)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("order %d: %w", ev.ID, errUnknownOrder)
	}
	if err != nil {
		return fmt.Errorf("read order %d: %w", ev.ID, err)
	}
	if !validTransition(from, ev.Status) {
		return consumer.Domainf("invalid transition %s -> %s for order %d", from, ev.Status, ev.ID)
	}
	_, err = tx.Exec(ctx, `
		UPDATE order_status SET status = $2, events = events + 1, last_outbox_id = $3, updated_at = now()
		 WHERE order_id = $1`, ev.ID, ev.Status, outboxID)
	if err != nil {
		return fmt.Errorf("update order %d: %w", ev.ID, err)
	}
	return nil
}
