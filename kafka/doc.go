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
// Errors that callers branch on: ErrPoison (a record Kafka refuses for
// good: *PoisonError), ErrProduce (a record that kept failing:
// *ProduceError), ErrProducerClosed, and *AuthError from Check.
package kafka
