package poll

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/outbox"
)

// Config configures a Poller. Start from DefaultConfig.
type Config struct {
	// ConnString is the PostgreSQL DSN (URL or key=value) of ordinary,
	// non-replication connections; one per worker.
	ConnString string
	// Schema and Table name the outbox table.
	Schema string
	Table  string
	// Interval is the time between the starts of two polls of a worker
	// while the table has fewer than BatchSize unpublished rows.
	Interval time.Duration
	// BatchSize is the LIMIT of one poll: the most rows one transaction
	// locks, produces and marks.
	BatchSize int
	// Workers is the number of concurrent polling transactions (one
	// connection each). More than one loses per-key order; see the package
	// documentation.
	Workers int
	// Mapping shapes the records as under CDC: the default topic (for rows
	// whose topic column is absent or NULL), headers, encodings.
	outbox.Mapping
	// Encoder, when set, writes every record in a wire format before it
	// is produced (Schema Registry formats, CloudEvents).
	Encoder Encoder
	// DeadLetterTopic names the dead-letter topic in logs; set it together
	// with Deps.NewDeadLetterer.
	DeadLetterTopic string
	// ShutdownTimeout bounds the wait for the batches in flight when Run's
	// context is cancelled; those not acknowledged by then are rolled back
	// and sent again by the next poller.
	ShutdownTimeout time.Duration
	// RestartBackoffMin and RestartBackoffMax bound the capped exponential
	// backoff between sessions after an error.
	RestartBackoffMin time.Duration
	RestartBackoffMax time.Duration
	// DeletedUnpublishedCheck is how often the poller compares the table's
	// statistics to notice rows deleted before it published them (see
	// unseenDeletes); 0 turns the check off.
	DeletedUnpublishedCheck time.Duration
}

// DefaultConfig returns the defaults of outboxd run --source=poll.
func DefaultConfig() Config {
	return Config{
		Schema:            "public",
		Table:             "outbox",
		Interval:          100 * time.Millisecond,
		BatchSize:         1000,
		Workers:           1,
		ShutdownTimeout:   30 * time.Second,
		RestartBackoffMin: 500 * time.Millisecond,
		RestartBackoffMax: 30 * time.Second,

		DeletedUnpublishedCheck: 30 * time.Second,
	}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.ConnString == "" {
		errs = append(errs, errors.New("no PostgreSQL connection string"))
	}
	if c.Schema == "" || c.Table == "" {
		errs = append(errs, fmt.Errorf("outbox table must be named, got schema %q table %q", c.Schema, c.Table))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("poll interval must be > 0, got %s", c.Interval))
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		errs = append(errs, fmt.Errorf("poll batch size must be in 1..100000, got %d", c.BatchSize))
	}
	if c.Workers < 1 || c.Workers > 64 {
		errs = append(errs, fmt.Errorf("poll workers must be in 1..64, got %d", c.Workers))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("shutdown timeout must be > 0, got %s", c.ShutdownTimeout))
	}
	if c.RestartBackoffMin <= 0 || c.RestartBackoffMax < c.RestartBackoffMin {
		errs = append(errs, fmt.Errorf("restart backoff must satisfy 0 < min ≤ max, got min %s max %s", c.RestartBackoffMin, c.RestartBackoffMax))
	}
	if c.DeadLetterTopic != "" && c.DeadLetterTopic == c.DefaultTopic {
		errs = append(errs, errors.New("dead-letter topic must differ from the default topic"))
	}
	return errors.Join(errs...)
}
