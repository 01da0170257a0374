package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// Config configures the sarama producer. Start from DefaultConfig.
type Config struct {
	Brokers  []string
	ClientID string
	// Version is the Kafka protocol version to speak. Kafka 4 removed the
	// old protocol versions (KIP-896): it must be modern.
	Version sarama.KafkaVersion
	// Compression: none, gzip, snappy, lz4 or zstd.
	Compression string
	// Linger, when > 0, waits up to that long to batch records. Zero sends
	// as soon as the previous request returns: batches under load, adds no
	// latency when idle.
	Linger time.Duration
	// MaxMessageBytes is the largest record the producer accepts, and the
	// largest record batch it builds. Lowered at start to the broker's
	// message.max.bytes when that is smaller (see BrokerLimits).
	MaxMessageBytes int
	// MaxRequestBytes caps one produce request (all its batches): the
	// broker closes the connection of a larger one. Lowered at start to the
	// broker's socket.request.max.bytes when that is smaller.
	MaxRequestBytes int
	// EncodedBytes, when > 0, bounds the bytes of the produce requests the
	// producer holds encoded at once, across all brokers: sarama encodes a
	// request's batches twice over (the batch's records, kept with the
	// batch until it is answered, and the whole request, while it is
	// written), beside the records they were built from. Each request then
	// carries at most EncodedBytes / (2 × brokers) of batches — never less
	// than one batch, which a request always carries. The publisher sets it
	// to half its byte budget, so that what is live at the top of a drain
	// stays within 1.5 × the budget (README "Memory").
	EncodedBytes int
	// RetryBackoff and RetryBackoffMax bound the backoff (with jitter)
	// between two attempts at the same batch.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// DeliveryTimeout is how long a record may stay undelivered from its
	// first attempt (its batch's first send; for a record that could not
	// be sent, from when it could first have been) before it fails and the
	// pipeline restarts: whatever kept it — retriable errors (broker down,
	// not enough replicas), no leader, or a request that is never
	// answered. Until then the producer sends the same batch again, which
	// keeps per-partition order and adds no duplicate; a restart sends
	// everything unconfirmed again. Below RequestTimeout (the time a broker
	// may take to answer while it waits for its in-sync replicas) a slow
	// but healthy answer can come too late, as with the Java client's
	// delivery.timeout.ms below request.timeout.ms.
	DeliveryTimeout time.Duration
	// UnknownTopicTimeout is how long a topic the brokers call unknown is
	// looked up again before its records are poison.
	UnknownTopicTimeout time.Duration
	// MetadataRefresh is how often the metadata of every topic in use is
	// looked up even when nothing fails, which is how a partition count
	// change is noticed. Zero: only on errors.
	MetadataRefresh time.Duration
	// CheckpointReadTimeout bounds a ReadCompacted (brokers that do not
	// answer; it never waits for open transactions). It must be > 0.
	CheckpointReadTimeout time.Duration
	// RequestTimeout is how long a broker may wait for the in-sync
	// replicas before answering a produce request; the connection's read
	// timeout is five seconds more, which bounds a request to a broker that
	// stopped answering (a black hole).
	RequestTimeout time.Duration
	// ContinueAfterPoison makes a poison record fail alone (the pipeline
	// diverts it to the dead-letter topic) instead of stopping its
	// partition. Set when a dead-letter topic is configured.
	ContinueAfterPoison bool
	// TransactionalID, when set, makes the producer transactional (see
	// Producer.Commit): exactly-once publishing. Two producers with the same
	// id fence each other.
	TransactionalID string
	// TransactionTimeout is how long the coordinator lets a transaction stay
	// open before it aborts it (capped by the brokers'
	// transaction.max.timeout.ms, 15 min by default).
	TransactionTimeout time.Duration
	// Security: TLS and SASL.
	Security Security
	// Configure, when set, is applied last (tests).
	Configure func(*sarama.Config)
}

// DefaultConfig returns the producer settings outboxd needs for
// durability and per-key order: acks=all, idempotent, one request in flight
// per broker, the Java client's partitioner.
func DefaultConfig() Config {
	return Config{
		ClientID:        "outboxd",
		Version:         sarama.V4_1_0_0,
		Compression:     "none",
		MaxMessageBytes: 1000000,
		MaxRequestBytes: 100 << 20, // Kafka's socket.request.max.bytes default
		RetryBackoff:    50 * time.Millisecond,
		RetryBackoffMax: time.Second,
		DeliveryTimeout: 2 * time.Minute,
		RequestTimeout:  10 * time.Second,

		UnknownTopicTimeout: 30 * time.Second,
		MetadataRefresh:     30 * time.Second,
		// The read waits for no transaction (see ReadCompacted): a minute
		// is for brokers slow to answer, as the start checks allow.
		CheckpointReadTimeout: time.Minute,

		// Above the 2-minute delivery timeout (see Validate), with room for
		// a commit's own retries, and well under the brokers' default cap
		// (transaction.max.timeout.ms, 15 min): an open transaction hides
		// later records of its partitions from read_committed consumers
		// of every other producer until it ends, so a crashed instance's
		// transaction should not block them for long.
		TransactionTimeout: 5 * time.Minute,
	}
}

// Validate checks the settings.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers: set --kafka-brokers (host:port,...)"))
	}
	var codec sarama.CompressionCodec
	if err := codec.UnmarshalText([]byte(c.Compression)); err != nil {
		errs = append(errs, fmt.Errorf("unknown Kafka compression %q: use none, gzip, snappy, lz4 or zstd", c.Compression))
	}
	if c.MaxRequestBytes < c.MaxMessageBytes {
		errs = append(errs, fmt.Errorf("max request bytes (%d) must be ≥ max message bytes (%d): set --kafka-max-request-bytes", c.MaxRequestBytes, c.MaxMessageBytes))
	}
	if c.MaxMessageBytes < 1 {
		errs = append(errs, fmt.Errorf("max message bytes must be ≥ 1, got %d", c.MaxMessageBytes))
	}
	if c.RetryBackoff <= 0 || c.RetryBackoffMax < c.RetryBackoff {
		errs = append(errs, fmt.Errorf("Kafka retry backoff must satisfy 0 < min ≤ max, got min %s max %s", c.RetryBackoff, c.RetryBackoffMax))
	}
	if c.DeliveryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("Kafka delivery timeout must be > 0, got %s: set --kafka-delivery-timeout", c.DeliveryTimeout))
	}
	if c.CheckpointReadTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--checkpoint-read-timeout must be > 0, got %s", c.CheckpointReadTimeout))
	}
	if c.UnknownTopicTimeout < 0 || c.MetadataRefresh < 0 {
		errs = append(errs, fmt.Errorf("Kafka unknown-topic timeout and metadata refresh must be ≥ 0, got %s and %s", c.UnknownTopicTimeout, c.MetadataRefresh))
	}
	if c.TransactionalID != "" && c.TransactionTimeout <= c.DeliveryTimeout {
		errs = append(errs, fmt.Errorf("--kafka-txn-timeout (%s) must exceed --kafka-delivery-timeout (%s): a transaction must outlive the retries of its records, or the coordinator aborts it while they still succeed", c.TransactionTimeout, c.DeliveryTimeout))
	}
	if c.RequestTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("Kafka request timeout must be ≥ 1ms, got %s", c.RequestTimeout))
	}
	if err := c.Security.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Sarama builds the sarama configuration.
func (c Config) Sarama() (*sarama.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sc := sarama.NewConfig()
	sc.ClientID = c.ClientID
	sc.Version = c.Version
	sc.Metadata.AllowAutoTopicCreation = false
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// For sarama's own producers (the consumer package's dead-letter
	// producer); Producer retries by DeliveryTimeout.
	sc.Producer.Retry.Max = 10
	sc.Producer.Retry.Backoff = c.RetryBackoffMax
	sc.Producer.Timeout = c.RequestTimeout
	sc.Net.DialTimeout = 5 * time.Second
	sc.Net.ReadTimeout = c.RequestTimeout + 5*time.Second
	sc.Net.WriteTimeout = c.RequestTimeout + 5*time.Second
	sc.Metadata.Retry.Max = 1
	sc.Metadata.Retry.Backoff = c.RetryBackoff
	sc.Producer.MaxMessageBytes = c.MaxMessageBytes
	sc.Producer.Partitioner = NewJavaPartitioner
	sc.Producer.Flush.Frequency = c.Linger
	_ = sc.Producer.Compression.UnmarshalText([]byte(c.Compression))
	if err := c.Security.Apply(sc); err != nil {
		return nil, err
	}
	if c.Configure != nil {
		c.Configure(sc)
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	return sc, nil
}
