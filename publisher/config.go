package publisher

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/outboxd/outboxd/outbox"
)

// Config tunes the pipeline and its supervisor. Start from DefaultConfig.
type Config struct {
	// Mapping shapes the records: the default topic, the id and key
	// headers, the key and value encodings.
	outbox.Mapping
	// DeadLetterTopic, when set, receives poison events (those Kafka refuses
	// for good) and bad events (rows that cannot become a record) instead
	// of halting the service.
	DeadLetterTopic string
	// SkipBadEvents are the LSNs of bad events to skip (count, log, and
	// confirm past them) instead of halting on them: what the halt's
	// message tells the operator to set. An event at one of them that is
	// not bad is published as usual. Earlier ones must stay listed until
	// their transactions are confirmed: they are read again until then.
	SkipBadEvents []pglogrepl.LSN
	// MaxRecordBytes is the producer's record limit (kafka.Config's
	// MaxMessageBytes). Without a dead-letter topic, an event over it is a
	// bad event found before it is produced, so that the halt names the
	// --skip-bad-event that skips it. 0: left to the producer.
	MaxRecordBytes int
	// MaxInFlightEvents and MaxInFlightBytes bound what is produced and not
	// yet acknowledged. When reached, reading from the slot pauses (status
	// updates keep flowing).
	MaxInFlightEvents int
	MaxInFlightBytes  int64
	// ShutdownTimeout bounds the wait for in-flight acknowledgements after a
	// stop is requested.
	ShutdownTimeout time.Duration
	// RestartBackoffMin and RestartBackoffMax bound the capped exponential
	// backoff between pipeline restarts after an error.
	RestartBackoffMin time.Duration
	RestartBackoffMax time.Duration
	// StandbyPollInterval is how often a standby checks whether the slot
	// became free.
	StandbyPollInterval time.Duration
	// Delivery is AtLeastOnce (the default) or ExactlyOnce: whole Postgres
	// transactions grouped into Kafka transactions, each with the
	// checkpoint of its last Postgres transaction; a record is confirmed
	// to Postgres only after its Kafka transaction committed.
	Delivery string
	// CheckpointTopic is the compacted topic of checkpoints (where outboxd
	// was): replayed transactions below the checkpoint are skipped, and a
	// slot ahead of it is a gap. Empty: no checkpoints (at-least-once only).
	CheckpointTopic string
	// CheckpointInterval is how often a checkpoint is written when nothing
	// else writes one (at-least-once mode, an idle outbox).
	CheckpointInterval time.Duration
	// TxnMaxEvents and TxnMaxAge close a Kafka transaction at the next
	// Postgres commit once it holds that many events or is that old; it is
	// also closed whenever no more Postgres transaction is waiting. A
	// Postgres transaction is never split.
	TxnMaxEvents int
	TxnMaxAge    time.Duration
	// AcceptGap starts streaming although the slot is ahead of the
	// checkpoint or the checkpoint is another system's (see ErrGap).
	AcceptGap bool
	// Encoder, when set, writes every record in a wire format before it
	// is produced (see Encoder); nil: records as NewRecord builds them.
	Encoder Encoder
	// CrashAfterProduce, when > 0, makes the process exit hard (status 3)
	// right after Kafka acknowledged that many events and before their LSN is
	// confirmed. For demonstrating at-least-once delivery only.
	CrashAfterProduce int
}

// DefaultConfig returns a configuration tuned for latency on a single broker.
func DefaultConfig() Config {
	return Config{
		Mapping:             outbox.DefaultMapping(),
		MaxInFlightEvents:   20000,
		MaxInFlightBytes:    64 << 20,
		ShutdownTimeout:     30 * time.Second,
		RestartBackoffMin:   500 * time.Millisecond,
		RestartBackoffMax:   30 * time.Second,
		StandbyPollInterval: 2 * time.Second,
		Delivery:            AtLeastOnce,
		CheckpointTopic:     "outboxd.checkpoints",
		CheckpointInterval:  200 * time.Millisecond,
		TxnMaxEvents:        10000,
		TxnMaxAge:           50 * time.Millisecond,
	}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxInFlightEvents < 1 {
		errs = append(errs, fmt.Errorf("max in-flight events must be ≥ 1, got %d", c.MaxInFlightEvents))
	}
	if c.MaxInFlightBytes < 1 {
		errs = append(errs, fmt.Errorf("max in-flight bytes must be ≥ 1, got %d", c.MaxInFlightBytes))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout must be > 0, got %s", c.ShutdownTimeout))
	}
	if c.RestartBackoffMin <= 0 || c.RestartBackoffMax < c.RestartBackoffMin {
		errs = append(errs, fmt.Errorf("restart backoff must satisfy 0 < min ≤ max, got min %s max %s", c.RestartBackoffMin, c.RestartBackoffMax))
	}
	if c.StandbyPollInterval <= 0 {
		errs = append(errs, fmt.Errorf("standby poll interval must be > 0, got %s", c.StandbyPollInterval))
	}
	switch c.Delivery {
	case AtLeastOnce:
	case ExactlyOnce:
		if c.CheckpointTopic == "" {
			errs = append(errs, errors.New("exactly-once delivery needs a checkpoint topic: set --checkpoint-topic"))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown delivery %q: use %s or %s", c.Delivery, AtLeastOnce, ExactlyOnce))
	}
	if c.CheckpointTopic != "" && c.CheckpointInterval <= 0 {
		errs = append(errs, fmt.Errorf("checkpoint interval must be > 0, got %s", c.CheckpointInterval))
	}
	if c.TxnMaxEvents < 1 || c.TxnMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("Kafka transaction limits must be > 0, got %d events, %s", c.TxnMaxEvents, c.TxnMaxAge))
	}
	if c.CrashAfterProduce < 0 {
		errs = append(errs, fmt.Errorf("crash after produce must be ≥ 0, got %d", c.CrashAfterProduce))
	}
	if c.DeadLetterTopic != "" && c.DeadLetterTopic == c.DefaultTopic {
		errs = append(errs, errors.New("dead-letter topic must differ from the default topic"))
	}
	if err := c.Mapping.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
