// Package kafka is outboxd's one Kafka layer, used by the CDC publisher, the
// polling publisher and the consumer package alike:
//
//   - Config, DefaultConfig and Validate: brokers, protocol version,
//     batching, retries, timeouts, and Security (TLS and SASL PLAIN,
//     SCRAM-SHA-256, SCRAM-SHA-512), with the same --kafka-* flags in every
//     program (Security.AddFlags); Check turns a failed authentication or TLS
//     verification into one clear error.
//   - Producer: the idempotent producer that keeps per-partition order
//     through every failure (see its documentation for the rules and for
//     why sarama's AsyncProducer could not), with the Java client's murmur2
//     partitioning so keys land where Java producers put them.
//   - DeadLetterer and the dead-letter header vocabulary (dlq-*), shared with
//     the consumer package.
//
// A topic the brokers call unknown, or whose partitions have no leader yet
// (usually one created a moment ago), is looked up again after 10 ms,
// doubling to 250 ms, until it appears or UnknownTopicTimeout calls it
// missing; its first record goes with the lookup that finds it. Other
// lookup failures back off as produce retries do (RetryBackoff to
// RetryBackoffMax).
//
// A topic's partition count is looked up again every MetadataRefresh. When
// it grows, records routed by the old count are acknowledged before any is
// routed by the new one (per-key order kept). It cannot shrink in Kafka; a
// lower count means the topic was deleted and recreated with fewer
// partitions, and some partitions the producer routes to are gone. Then
// every record of the topic in this producer fails with a
// *PartitionsShrunkError (an ErrProduce: a restart, not poison) naming the
// topic and both counts, and the restart's producer routes keys by the new
// count (murmur2 % n): a key may move to another partition, and its order
// across the change holds only if the old partitions had been drained
// before the recreation. Nothing waits silently: a record the producer
// cannot deliver — no leader, a request never answered — fails at
// DeliveryTimeout from its first attempt (see Producer, rule 3).
//
// Errors that callers branch on: ErrPoison (a record Kafka refuses for
// good: *PoisonError), ErrProduce (a record that kept failing:
// *ProduceError, *PartitionsShrunkError inside it for a recreated topic),
// ErrTimestampRefused (a broker's INVALID_TIMESTAMP: *TimestampError, which
// halts — a clock or a topic setting, not the event, so not poison),
// ErrProducerClosed, and *AuthError from Check.
package kafka
