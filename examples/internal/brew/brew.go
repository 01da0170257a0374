// Package brew is the small domain shared by the examples: the topics, the
// order statuses and the JSON events the order service writes to its outbox
// and the status consumer reads.
package brew

import (
	"fmt"
	"strconv"
	"strings"
)

// Topics of the demo.
const (
	OrdersTopic = "brew.orders.v1"       // order.created
	StatusTopic = "brew.order-status.v1" // order.status_changed
)

// Event types (the "type" field of every payload).
const (
	TypeOrderCreated  = "order.created"
	TypeStatusChanged = "order.status_changed"
)

// Order statuses.
const (
	StatusCreated             = "created"
	StatusSentToEstablishment = "sent_to_establishment"
	StatusAccepted            = "accepted"
	StatusRejected            = "rejected"
	StatusCompleted           = "completed"
	StatusCancelled           = "cancelled"
)

// Statuses lists every status.
var Statuses = []string{StatusCreated, StatusSentToEstablishment, StatusAccepted, StatusRejected, StatusCompleted, StatusCancelled}

// KnownStatus reports whether s is one of Statuses.
func KnownStatus(s string) bool {
	for _, k := range Statuses {
		if s == k {
			return true
		}
	}
	return false
}

// OrderCreated is the payload of an order.created event.
type OrderCreated struct {
	Type     string `json:"type"`
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
	Amount   string `json:"amount"` // decimal, as numeric(12,2) prints it: "12.50"
	Status   string `json:"status"`
}

// StatusChanged is the payload of an order.status_changed event.
type StatusChanged struct {
	Type   string `json:"type"`
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

// AggregateID is the outbox aggregate_id (and Kafka key) of an order.
func AggregateID(orderID int64) string { return "order-" + strconv.FormatInt(orderID, 10) }

// ParseAggregateID is the inverse of AggregateID.
func ParseAggregateID(s string) (int64, error) {
	rest, ok := strings.CutPrefix(s, "order-")
	id, err := strconv.ParseInt(rest, 10, 64)
	if !ok || err != nil || id <= 0 {
		return 0, fmt.Errorf("aggregate id %q: want order-<id>", s)
	}
	return id, nil
}

// SentHookSQL is the demo's post-publish hook for the orders topic (outboxd
// run --hook ORDERS_TOPIC=SQL; $1 is the event's aggregate id). Once Kafka
// acked an order.created event the order counts as sent to the
// establishment: the hook records that and emits the order.status_changed
// event to statusTopic, in one statement. The status = 'created' guard makes
// it idempotent: after a crash the event is published again and the hook
// runs again, changing nothing.
func SentHookSQL(statusTopic string) string {
	return `WITH o AS (
  UPDATE orders SET status = 'sent_to_establishment', updated_at = now()
   WHERE id = split_part($1, '-', 2)::bigint AND status = 'created'
  RETURNING id)
INSERT INTO outbox (aggregate_id, topic, payload)
SELECT 'order-' || id, '` + strings.ReplaceAll(statusTopic, "'", "''") + `',
       jsonb_build_object('type', 'order.status_changed', 'id', id, 'status', 'sent_to_establishment')
  FROM o`
}
