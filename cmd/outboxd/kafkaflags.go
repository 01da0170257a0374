package main

import (
	"fmt"
	"time"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/publisher"
)

// kafkaTopicOpts are the flags for what shared clusters bring:
// transactions that time out, topics that vanish or grow.
type kafkaTopicOpts struct {
	txnTimeout          time.Duration
	unknownTopicTimeout time.Duration
	metadataRefresh     time.Duration
	checkpointRead      time.Duration
}

func (o *kafkaTopicOpts) addFlags(fs *flagSet, k kafka.Config) {
	fs.DurationVar(&o.txnTimeout, "kafka-txn-timeout", k.TransactionTimeout, "exactly-once: how long the Kafka coordinator lets a transaction stay open before it aborts it; must exceed --kafka-delivery-timeout and stay within the brokers' transaction.max.timeout.ms (15m by default); a PostgreSQL transaction that takes longer to publish halts outboxd with a message naming this flag", inDelivery,
		doc("exactly-once: how long the Kafka coordinator lets a transaction stay open before it aborts it; must exceed `--kafka-delivery-timeout` and stay within the brokers' `transaction.max.timeout.ms` (15m by default); a PostgreSQL transaction that takes longer to publish halts outboxd with a message naming this flag; one that would have fit without the time a request kept failing (a leader or the coordinator away) restarts the session instead ([shared clusters](guarantees.md#shared-clusters))"))
	fs.DurationVar(&o.unknownTopicTimeout, "kafka-unknown-topic-timeout", k.UnknownTopicTimeout, "how long a topic the brokers call unknown is looked up again (leader changes, rolling restarts) before its events are poison", inKafka,
		doc("how long a topic the brokers call unknown is looked up again (a topic just created, leader changes, rolling restarts; every 10 ms doubling to 250 ms) before its events are poison ([shared clusters](guarantees.md#shared-clusters))"))
	fs.DurationVar(&o.checkpointRead, "checkpoint-read-timeout", k.CheckpointReadTimeout, "how long reading the checkpoint topic at a session's start may take before the session restarts (the read never waits for other producers' open transactions: only for brokers that do not answer)", inDelivery,
		doc("how long reading the checkpoint topic at a session's start may take before the session restarts; the read goes to the high watermark without waiting for any producer's open transaction, so only brokers that do not answer make it slow ([shared clusters](guarantees.md#shared-clusters)). `outboxd status` has the same flag, 30 s by default"))
	fs.DurationVar(&o.metadataRefresh, "kafka-metadata-refresh", k.MetadataRefresh, "how often topic metadata is refreshed even when nothing fails, to notice partition count changes (0: only on errors)", inKafka,
		doc("how often topic metadata is refreshed even when nothing fails, to notice partition count changes (0: only on errors) ([shared clusters](guarantees.md#shared-clusters))"))
}

// apply sets the options on k and checks them against the delivery mode.
func (o *kafkaTopicOpts) apply(k *kafka.Config, pub publisher.Config) error {
	k.TransactionTimeout = o.txnTimeout
	k.UnknownTopicTimeout = o.unknownTopicTimeout
	k.MetadataRefresh = o.metadataRefresh
	k.CheckpointReadTimeout = o.checkpointRead
	if pub.Delivery != publisher.ExactlyOnce {
		return nil
	}
	if o.txnTimeout <= k.DeliveryTimeout {
		return fmt.Errorf("--kafka-txn-timeout (%s) must exceed --kafka-delivery-timeout (%s): a Kafka transaction must outlive its records' retries, or the coordinator aborts it while they still succeed", o.txnTimeout, k.DeliveryTimeout)
	}
	if pub.TxnMaxAge >= o.txnTimeout {
		return fmt.Errorf("--kafka-txn-max-age (%s) must be below --kafka-txn-timeout (%s)", pub.TxnMaxAge, o.txnTimeout)
	}
	return nil
}
