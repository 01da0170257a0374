// Package publisher turns committed outbox transactions into Kafka records
// and back into a position that is safe to confirm to PostgreSQL.
//
// The data path is Source → Pipeline → Producer. A Source (the replication
// stream) delivers Begin/Event/Commit messages in commit order; the Pipeline
// produces each event, tracks every transaction in a Watermark and exposes the
// end LSN of the contiguous prefix of transactions whose events Kafka has all
// acknowledged. Only that position is ever confirmed, so a crash re-sends
// (at-least-once) and never loses.
//
// A Service supervises the whole: on a Kafka or Postgres failure it stops,
// confirms nothing more, and restarts from the slot's confirmed position with
// capped exponential backoff; when another process holds the slot it waits as
// a hot standby. A poison event (one Kafka refuses for good) halts the
// service, or goes to a dead-letter topic when one is configured.
//
// Cancellation: cancelling the context passed to Service.Run stops reading
// from the source; events already produced are awaited for at most
// Config.ShutdownTimeout, a final status update confirms what Kafka acked,
// and Run returns nil.
package publisher
