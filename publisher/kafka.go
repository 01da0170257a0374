package publisher

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// KafkaConfig configures the sarama producer. Start from DefaultKafkaConfig.
type KafkaConfig struct {
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
	// MaxMessageBytes is the largest record the producer accepts.
	MaxMessageBytes int
	// RetryBackoff and RetryBackoffMax bound the backoff (with jitter)
	// between two attempts at the same batch.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// DeliveryTimeout is how long a batch may keep failing with retriable
	// errors (broker down, no leader, not enough replicas) before its
	// records fail and the pipeline restarts. Until then the producer sends
	// the same batch again, which keeps per-partition order and adds no
	// duplicate; a restart sends everything unconfirmed again.
	DeliveryTimeout time.Duration
	// RequestTimeout is how long a broker may wait for the in-sync
	// replicas before answering a produce request; the connection's read
	// timeout is five seconds more, which bounds a request to a broker that
	// stopped answering (a black hole).
	RequestTimeout time.Duration
	// ContinueAfterPoison makes a poison record fail alone (the pipeline
	// diverts it to the dead-letter topic) instead of stopping its
	// partition. Set when a dead-letter topic is configured.
	ContinueAfterPoison bool
	// Configure, when set, is applied last (TLS, SASL, tests).
	Configure func(*sarama.Config)
}

// DefaultKafkaConfig returns the producer settings outboxd needs for
// durability and per-key order: acks=all, idempotent, one request in flight
// per broker, the Java client's partitioner.
func DefaultKafkaConfig() KafkaConfig {
	return KafkaConfig{
		ClientID:        "outboxd",
		Version:         sarama.V4_1_0_0,
		Compression:     "none",
		MaxMessageBytes: 1000000,
		RetryBackoff:    50 * time.Millisecond,
		RetryBackoffMax: time.Second,
		DeliveryTimeout: 2 * time.Minute,
		RequestTimeout:  10 * time.Second,
	}
}

// Validate checks the settings.
func (c KafkaConfig) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers: set --kafka-brokers (host:port,...)"))
	}
	var codec sarama.CompressionCodec
	if err := codec.UnmarshalText([]byte(c.Compression)); err != nil {
		errs = append(errs, fmt.Errorf("unknown Kafka compression %q: use none, gzip, snappy, lz4 or zstd", c.Compression))
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
	if c.RequestTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("Kafka request timeout must be ≥ 1ms, got %s", c.RequestTimeout))
	}
	return errors.Join(errs...)
}

// Sarama builds the sarama configuration.
func (c KafkaConfig) Sarama() (*sarama.Config, error) {
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
	// For sarama's own producers (the dead-letterer); KafkaProducer
	// retries by DeliveryTimeout.
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
	if c.Configure != nil {
		c.Configure(sc)
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	return sc, nil
}

// saramaMessage maps r to a sarama message for topic, with extra room in
// the header slice for the dead-letter headers.
func saramaMessage(topic string, r *Record, extraHeaders ...sarama.RecordHeader) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{
		Topic:     topic,
		Key:       sarama.ByteEncoder(r.Key),
		Value:     sarama.ByteEncoder(r.Value),
		Timestamp: r.Timestamp,
	}
	if n := len(r.Headers) + len(extraHeaders); n > 0 {
		m.Headers = make([]sarama.RecordHeader, 0, n)
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		m.Headers = append(m.Headers, extraHeaders...)
	}
	return m
}

// permanent are the errors for which a retry of the same record can never
// succeed.
var permanent = []error{
	sarama.ErrMessageSizeTooLarge,
	sarama.ErrUnknownTopicOrPartition,
	sarama.ErrInvalidTopic,
	sarama.ErrMessageSetSizeTooLarge,
	sarama.ErrInvalidRecord,
	sarama.ErrInvalidTimestamp,
}

func classify(r *Record, err error) error {
	// sarama refuses a record over Producer.MaxMessageBytes itself, with a
	// ConfigurationError, before it reaches the broker.
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) {
		return &PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Size: r.Size(), Err: err}
	}
	for _, p := range permanent {
		if errors.Is(err, p) {
			return &PoisonError{OutboxID: r.OutboxID, Topic: r.Topic, Size: r.Size(), Err: err}
		}
	}
	return &ProduceError{OutboxID: r.OutboxID, Topic: r.Topic, Err: err}
}

// Dead-letter headers added to a diverted record.
const (
	HeaderDLQError         = "outboxd-error"
	HeaderDLQOriginalTopic = "outboxd-original-topic"
	HeaderDLQPayloadBytes  = "outboxd-payload-bytes"
	HeaderDLQPayloadOmit   = "outboxd-payload-omitted"
)

// KafkaDeadLetterer sends poison records to the dead-letter topic with a
// synchronous producer.
type KafkaDeadLetterer struct {
	topic    string
	maxBytes int
	sp       sarama.SyncProducer
}

// NewKafkaDeadLetterer connects a synchronous producer for topic.
func NewKafkaDeadLetterer(cfg KafkaConfig, topic string) (*KafkaDeadLetterer, error) {
	sc, err := cfg.Sarama()
	if err != nil {
		return nil, err
	}
	sp, err := sarama.NewSyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka dead-letter producer: %w", err)
	}
	return &KafkaDeadLetterer{topic: topic, maxBytes: cfg.MaxMessageBytes, sp: sp}, nil
}

// DeadLetter implements DeadLetterer. The original key, value and headers are
// kept; a value that made the record too large is omitted (it stays in the
// outbox table) and its size is noted in a header.
func (d *KafkaDeadLetterer) DeadLetter(_ context.Context, r *Record, cause error) error {
	m := saramaMessage(d.topic, r,
		sarama.RecordHeader{Key: []byte(HeaderDLQError), Value: []byte(cause.Error())},
		sarama.RecordHeader{Key: []byte(HeaderDLQOriginalTopic), Value: []byte(r.Topic)},
		sarama.RecordHeader{Key: []byte(HeaderDLQPayloadBytes), Value: strconv.AppendInt(nil, int64(len(r.Value)), 10)},
	)
	var ce sarama.ConfigurationError
	if r.Size()+512 > d.maxBytes || errors.As(cause, &ce) ||
		errors.Is(cause, sarama.ErrMessageSizeTooLarge) || errors.Is(cause, sarama.ErrMessageSetSizeTooLarge) {
		m.Value = nil
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(HeaderDLQPayloadOmit), Value: []byte("true")})
	}
	_, _, err := d.sp.SendMessage(m)
	return err
}

// Close closes the producer.
func (d *KafkaDeadLetterer) Close() error { return d.sp.Close() }
