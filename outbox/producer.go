package outbox

import (
	"context"

	"github.com/outboxd/outboxd/kafka"
)

// Producer sends records to Kafka asynchronously: the Kafka side of both
// sources (kafka.Producer, or a test fake).
type Producer interface {
	// Send enqueues r. It blocks while the producer's input is full.
	Send(ctx context.Context, r *kafka.Record) error
	// Results returns every record given to Send exactly once, acknowledged
	// (Err nil) or failed after the producer's own retries. A failed
	// record's Err wraps kafka.ErrPoison when Kafka refused it for good. The
	// channel is closed after Close.
	Results() <-chan *kafka.Record
	// Close stops the producer. Records still in flight come back on
	// Results, acknowledged or failed, before it is closed.
	Close() error
}

// DeadLetterer diverts a poison record to the dead-letter topic and returns
// once Kafka acknowledged it.
type DeadLetterer interface {
	DeadLetter(ctx context.Context, r *kafka.Record, cause error) error
}
