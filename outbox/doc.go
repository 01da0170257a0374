// Package outbox is what every source of outbox events shares, so that the
// polling source (package poll) uses it without the CDC pipeline (package
// publisher) and its replication stream:
//
//   - the Event an outbox row is, and how it becomes a kafka.Record
//     (Mapping, NewRecord);
//   - what a source needs of Kafka (Producer, DeadLetterer) and the
//     post-publish Hook;
//   - the Supervisor that runs a source's sessions one after another
//     (restart with backoff and jitter, standby, the shutdown watchdog);
//   - the Metrics, built once per process.
//
// It imports neither replication nor publisher.
package outbox
