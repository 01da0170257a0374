package consumer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/backoff"
	"github.com/outboxd/outboxd/kafka"
)

// Config configures a [Consumer]. Start from [DefaultConfig].
type Config struct {
	// Brokers are the Kafka bootstrap brokers.
	Brokers []string
	// GroupID is the Kafka consumer group.
	GroupID string
	// Topics are the topics to consume.
	Topics []string
	// ClientID is the Kafka client id.
	ClientID string
	// KafkaVersion is the protocol version to speak; Kafka 4 rejects the old
	// versions sarama defaults to.
	KafkaVersion sarama.KafkaVersion
	// SessionTimeout is the consumer group session timeout: how long the
	// group waits for a member that stopped heartbeating (crashed) before its
	// partitions move.
	SessionTimeout time.Duration

	// DeadLetterTopic names the dead-letter topic of a source topic; nil
	// means topic + ".dlq".
	DeadLetterTopic func(topic string) string

	// MaxRetries is how often a transient failure is retried in place before
	// the message is dead-lettered: a message gets at most 1 + MaxRetries
	// attempts.
	MaxRetries int
	// BackoffBase is the wait after the first failed attempt; it doubles
	// after each further one, up to BackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// CommitInterval is how often marked offsets are committed; 0 commits
	// after every message, or after every batch (one synchronous round trip
	// each).
	CommitInterval time.Duration

	// BatchSize is the most messages of one partition processed in one
	// transaction (see [BatchHandler] and [NewBatch]). 1 (the default) or 0
	// gives each message its own transaction. A batch holds at most what the
	// partition has fetched: the sarama channel buffer
	// (ChannelBufferSize) is raised to BatchSize when it is smaller.
	BatchSize int
	// BatchWait is how long a batch waits to fill up once it has its first
	// message. 0 takes only the messages already fetched and never waits, so
	// a lone message is processed as soon as it arrives. Ignored when
	// BatchSize ≤ 1.
	BatchWait time.Duration
	// BatchMaxBytes closes a batch once its messages' keys, values and
	// headers reach this many bytes (a message larger than that goes
	// alone). What a partition holds is then at most BatchMaxBytes plus one
	// message in its batch, plus what sarama has fetched and buffered for
	// it (ChannelBufferSize messages and one fetch of
	// Consumer.Fetch.Default bytes, grown to the largest record): see
	// consumer/doc.go "Memory". 0: 16 MiB.
	BatchMaxBytes int

	// DedupTable is the deduplication table, optionally schema-qualified.
	DedupTable string

	// Security: TLS and SASL, the same settings (and, with AddFlags, the
	// same flags) as outboxd's.
	Security kafka.Security

	// Sarama, when set, is called with the sarama configuration before the
	// clients are made, for settings this Config does not cover. It must
	// not turn auto-commit on.
	Sarama func(*sarama.Config)

	// OnDone, when set, is called once for every message that is done, after
	// its effect is durable (transaction committed, or dead-letter record
	// acknowledged) and before its offset is marked. It runs on the
	// partition's goroutine: keep it quick.
	OnDone func(m *Message, r Result)
}

// DefaultConfig returns the defaults: 5 retries with backoff from 100 ms
// doubling up to 5 s, offsets committed every second, one message per
// transaction (BatchSize 1), dedup table processed_outbox_ids, Kafka 4.1
// protocol, 10 s session timeout. Brokers, GroupID and Topics must be set.
func DefaultConfig() Config {
	return Config{
		ClientID:       "outboxd-consumer",
		KafkaVersion:   sarama.V4_1_0_0,
		SessionTimeout: 10 * time.Second,
		MaxRetries:     5,
		BackoffBase:    100 * time.Millisecond,
		BackoffMax:     5 * time.Second,
		CommitInterval: time.Second,
		BatchSize:      1,
		DedupTable:     "processed_outbox_ids",
	}
}

// Validate reports every invalid setting at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no Kafka brokers"))
	}
	if c.GroupID == "" {
		errs = append(errs, errors.New("no consumer group id"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("no topics"))
	}
	for _, t := range c.Topics {
		if strings.TrimSpace(t) == "" {
			errs = append(errs, errors.New("empty topic name"))
		} else if dlq := c.deadLetterTopic(t); dlq == t || dlq == "" {
			errs = append(errs, fmt.Errorf("topic %q: dead-letter topic %q must be another, non-empty topic", t, dlq))
		}
	}
	if c.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("max retries must be ≥ 0, got %d", c.MaxRetries))
	}
	if c.BackoffBase <= 0 {
		errs = append(errs, fmt.Errorf("backoff base must be > 0, got %s", c.BackoffBase))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("backoff max (%s) must be ≥ backoff base (%s)", c.BackoffMax, c.BackoffBase))
	}
	if c.CommitInterval < 0 {
		errs = append(errs, fmt.Errorf("commit interval must be ≥ 0, got %s", c.CommitInterval))
	}
	if c.BatchSize < 0 {
		errs = append(errs, fmt.Errorf("batch size must be ≥ 0, got %d", c.BatchSize))
	}
	if c.BatchMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("batch max bytes must be ≥ 0, got %d", c.BatchMaxBytes))
	}
	if c.BatchWait < 0 {
		errs = append(errs, fmt.Errorf("batch wait must be ≥ 0, got %s", c.BatchWait))
	}
	if c.SessionTimeout <= 0 {
		errs = append(errs, fmt.Errorf("session timeout must be > 0, got %s", c.SessionTimeout))
	}
	if _, err := tableIdent(c.DedupTable); err != nil {
		errs = append(errs, err)
	}
	if err := c.Security.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer: invalid config: %w", err)
	}
	return nil
}

// deadLetterTopic returns the dead-letter topic of topic.
func (c Config) deadLetterTopic(topic string) string {
	if c.DeadLetterTopic != nil {
		return c.DeadLetterTopic(topic)
	}
	return topic + ".dlq"
}

// DefaultBatchMaxBytes is BatchMaxBytes when it is 0.
const DefaultBatchMaxBytes = 16 << 20

// batchMaxBytes is BatchMaxBytes, or its default.
func (c Config) batchMaxBytes() int {
	if c.BatchMaxBytes > 0 {
		return c.BatchMaxBytes
	}
	return DefaultBatchMaxBytes
}

// batchSize is BatchSize, at least 1.
func (c Config) batchSize() int {
	return max(1, c.BatchSize)
}

// backoff is the wait after the n-th failure (n ≥ 1): BackoffBase·2^(n-1),
// at most BackoffMax.
func (c Config) backoff(n int) time.Duration {
	return backoff.Exponential(c.BackoffBase, c.BackoffMax, n)
}

// saramaConfig is the configuration of the group and the dead-letter
// producer: manual commits, read_committed, oldest offset for a new group, errors returned,
// dead-letter records acknowledged by all in-sync replicas.
func (c Config) saramaConfig() (*sarama.Config, error) {
	sc := sarama.NewConfig()
	sc.Version = c.KafkaVersion
	sc.ClientID = c.ClientID
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Enable = false
	sc.Consumer.Return.Errors = true
	// Records of aborted Kafka transactions (outboxd --delivery=exactly-once
	// restarting mid-transaction) are never handed to the handler.
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Group.Session.Timeout = c.SessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = c.SessionTimeout / 3
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	// A batch takes what the claim has buffered: let it buffer a batch.
	sc.ChannelBufferSize = max(sc.ChannelBufferSize, c.batchSize())
	if err := c.Security.Apply(sc); err != nil {
		return nil, err
	}
	if c.Sarama != nil {
		c.Sarama(sc)
	}
	return sc, nil
}
