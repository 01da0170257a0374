package kafka

import (
	"errors"
	"fmt"
)

var (
	// ErrPoison means Kafka refused an event for good (too large, unknown
	// topic, invalid record) or the event has no topic. Restarting would hit
	// it again, so the service halts unless a dead-letter topic is set.
	ErrPoison = errors.New("poison event")
	// ErrProduce means a produce failed after the producer's retries. The
	// pipeline restarts from the last confirmed position.
	ErrProduce = errors.New("produce failed")
)

// PoisonError names the event Kafka refused.
type PoisonError struct {
	OutboxID int64
	Topic    string
	Size     int // key + value + headers, bytes
	Err      error
}

func (e *PoisonError) Error() string {
	return fmt.Sprintf("poison event: outbox id %d to topic %q (%d bytes) refused: %v; nothing was confirmed past it: fix the cause (topic, size limits) or set --dead-letter-topic, then restart",
		e.OutboxID, e.Topic, e.Size, e.Err)
}

// Unwrap matches both ErrPoison and the cause.
func (e *PoisonError) Unwrap() []error { return []error{ErrPoison, e.Err} }

// ProduceError is a produce failure that is not the event's fault (broker
// unreachable, not enough replicas, timeouts).
type ProduceError struct {
	OutboxID int64
	Topic    string
	Err      error
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("produce outbox id %d to topic %q: %v", e.OutboxID, e.Topic, e.Err)
}

// Unwrap matches both ErrProduce and the cause.
func (e *ProduceError) Unwrap() []error { return []error{ErrProduce, e.Err} }
