package publisher

import (
	"context"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// Transactional is the producer exactly-once delivery needs (kafka.Producer
// with a transactional id): records go into a Kafka transaction that Commit
// makes visible and Abort drops. The transactional mode is only ever built
// with one (newDelivery), so nothing asserts it later.
type Transactional interface {
	outbox.Producer
	Commit(ctx context.Context) error
	Abort(ctx context.Context) error
}

// batchSender is an outbox.Producer (Send, Results, Close: what every
// delivery mode needs of Kafka) that takes several records at once, so that a
// transaction's records share requests (kafka.Producer). A producer without
// it (a test fake) gets them one by one; which one is decided once, in
// NewPipeline.
type batchSender interface {
	SendBatch(ctx context.Context, rs []*kafka.Record) error
}
