// Package consumer reads outbox events from Kafka (a sarama consumer group)
// and processes each one once, although outboxd delivers at least once.
//
// # Deduplication
//
// Every event carries its outbox id in the outbox-id header (an integer or a
// uuid) and, from outboxd with checkpoints on, its origin in the
// outbox-origin header (system id, database and a generation that changes
// after a restore); an event is identified by both (origin "" without the
// header). For each message (or batch of messages, see Batches below) the
// consumer begins a PostgreSQL transaction, runs
//
//	INSERT INTO processed_outbox_ids (origin, event_id, outbox_id, topic) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING
//
// and, when the row is new, calls the [Handler] with that same transaction;
// the transaction commits only if the handler succeeds. "Seen" and "done"
// therefore commit together: a crash before the commit leaves neither (the
// event is processed again), a crash after it leaves both (the redelivered
// event finds its id and is skipped as a duplicate). A skipped duplicate
// increments processed_outbox_ids.duplicates. The table ships with this
// package, not with outboxd migrate: create it with [Migrate] before
// [Consumer.Run], or add [SchemaSQL] to the service's own migrations. It is
//
//	CREATE TABLE processed_outbox_ids (
//	    origin       text        NOT NULL DEFAULT '',
//	    event_id     text        NOT NULL,
//	    outbox_id    bigint,
//	    topic        text        NOT NULL,
//	    processed_at timestamptz NOT NULL DEFAULT now(),
//	    duplicates   integer     NOT NULL DEFAULT 0,
//	    PRIMARY KEY (origin, event_id)
//	);
//
// One table serves the events of several outboxes, and ids an outbox hands
// out again after a restore are new events under the new origin — where
// outboxd sends the outbox-origin header (CDC with checkpoints on, in its own
// record shape). Events without it (--source=poll, --checkpoint-topic "",
// another --id-header) are deduplicated on the id alone: give each such
// outbox a table (and consumer) of its own. A table of
// the first shape (outbox_id bigint PRIMARY KEY) is upgraded by [Migrate]
// ([UpgradeSQL]).
//
// # Errors
//
// The handler classifies its errors. An error wrapped with [Domain] is
// permanent (the event is invalid for this consumer): the message goes to the
// dead-letter topic at once. Any other error is transient: the message is
// retried in place, up to [Config.MaxRetries] times with exponential backoff
// ([Config.BackoffBase] doubling up to [Config.BackoffMax]), and then goes to
// the dead-letter topic. A message without a valid outbox-id header is a
// domain error. A handler panic is a domain error too (it would panic again).
//
// Failures of the consumer's own statements (begin, the dedup insert, a
// commit the server never answered) are the database's, not the message's:
// they are retried with backoff until they succeed or the context ends, and
// never send a message to the dead-letter topic. Likewise, before a message
// whose transient retries are exhausted is dead-lettered, the database is
// pinged: when it is unreachable the retries start over once it is back, so an
// outage does not empty the topic into the dead-letter topic.
//
// # Dead-letter topic
//
// The dead-letter record ([Config.DeadLetterTopic], by default
// "<topic>.dlq") has the original key, value and headers plus the headers
// [HeaderError], [HeaderErrorClass], [HeaderSourceTopic],
// [HeaderSourcePartition], [HeaderSourceOffset], [HeaderAttempts] and
// [HeaderConsumerGroup]. It is sent synchronously and must be acknowledged by
// all in-sync replicas before the message counts as done. Dead-lettered ids are
// not recorded in the dedup table, so an event replayed from the dead-letter
// topic after a fix is processed.
//
// If the dead-letter publish fails, the message is not done: its offset is not
// committed, and [Consumer.Run] returns a [*DeadLetterError] after committing
// the messages done before it. The message is processed again when the
// consumer is restarted; nothing is lost. A crash between the dead-letter
// acknowledgement and the offset commit sends the message to the dead-letter
// topic again (at least once there too).
//
// # Offsets
//
// Offsets are committed manually (sarama's Consumer.Offsets.AutoCommit is
// off). A message's offset is marked only when the message is done: its
// transaction committed (processed or skipped as duplicate) or its
// dead-letter record acknowledged. Messages of a partition are done in offset
// order, one at a time (or one batch at a time, marked in order after the
// batch's commit), so a marked offset never passes a message that is not
// done. Marked offsets are committed every [Config.CommitInterval] (0: after
// every message or batch), when a partition is released and when the session
// ends. A crash loses at most the marks since the last commit; those messages
// are delivered again and skipped as duplicates.
//
// A poison message never blocks its partition: after at most MaxRetries
// retries it is in the dead-letter topic and the next message is processed.
//
// # Concurrency and throughput
//
// Partitions are processed concurrently: sarama runs the group handler's
// ConsumeClaim on a goroutine of its own for every claimed partition
// (documented on sarama.ConsumerGroup.Consume; consumer_group_session.go
// starts one per claim; TestRunPartitionsConcurrently checks it), and each
// partition has its own transaction, so the [DB] should allow as many
// connections as the consumer has partitions. Within a partition, messages
// are processed in order and, by default, each in its own transaction: a
// partition's throughput is bounded by one commit (one WAL flush on the
// server) per message, whatever the handler costs.
//
// # Batches
//
// With [Config.BatchSize] > 1 a partition takes up to BatchSize messages at
// a time: those already fetched, and with [Config.BatchWait] > 0 those that
// arrive within BatchWait (0: never wait). One transaction records all their
// outbox ids with one statement,
//
//	INSERT INTO processed_outbox_ids (origin, event_id, outbox_id, topic)
//	SELECT … FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])
//	ON CONFLICT DO NOTHING RETURNING origin, event_id
//
// counts the duplicates (an id processed before, or met earlier in the
// batch) as the single path does, calls the [BatchHandler] ([NewBatch]) with
// the new messages in offset order, or the [Handler] ([New]) for each in
// turn, and commits; then every message of the batch is done, reported to
// OnDone and marked, in order. If anything in the batch fails (the handler,
// a panic, the database, the commit), the transaction rolls back and the
// batch's messages are processed again one at a time, each in its own
// transaction, with the retry and dead-letter rules above: a poison message
// is retried or dead-lettered alone and never takes its batch neighbours
// with it, and no offset is marked past a message that is not done. A
// message without a valid outbox-id header is dead-lettered alone, in its
// place, between the batches before and after it. All the guarantees above
// hold for batches; what changes is the cost: one commit per batch, and a
// failed batch is done twice.
//
// # Memory
//
// One partition holds at most, in bytes: BatchMaxBytes (16 MiB by
// default) plus one message in the batch being processed, plus what sarama
// has fetched for it and not yet handed over — up to ChannelBufferSize
// messages (256, raised to BatchSize) and one fetch response of
// Consumer.Fetch.Default bytes (1 MiB, grown to the largest record when one
// is larger). With records of at most R bytes that is ≤ BatchMaxBytes + R +
// max(256, BatchSize)·R + max(1 MiB, R) per partition; lower
// ChannelBufferSize (Config.Sarama) for large records.
//
// # Tracing
//
// A message may carry the W3C Trace Context headers [HeaderTraceParent] and
// [HeaderTraceState] of the service that wrote the event. When it has a
// traceparent, the handler's context carries them ([TraceContextFrom]);
// [HeaderCarrier] lets an OpenTelemetry propagator read them directly.
package consumer
