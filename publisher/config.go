package publisher

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the pipeline and its supervisor. Start from DefaultConfig.
type Config struct {
	// DefaultTopic is used for rows whose topic column is absent or NULL.
	DefaultTopic string
	// DeadLetterTopic, when set, receives poison events (those Kafka refuses
	// for good) instead of halting the service.
	DeadLetterTopic string
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
	// CrashAfterProduce, when > 0, makes the process exit hard (status 3)
	// right after Kafka acknowledged that many events and before their LSN is
	// confirmed. For demonstrating at-least-once delivery only.
	CrashAfterProduce int
}

// DefaultConfig returns a configuration tuned for latency on a single broker.
func DefaultConfig() Config {
	return Config{
		MaxInFlightEvents:   20000,
		MaxInFlightBytes:    64 << 20,
		ShutdownTimeout:     30 * time.Second,
		RestartBackoffMin:   500 * time.Millisecond,
		RestartBackoffMax:   30 * time.Second,
		StandbyPollInterval: 2 * time.Second,
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
	if c.CrashAfterProduce < 0 {
		errs = append(errs, fmt.Errorf("crash after produce must be ≥ 0, got %d", c.CrashAfterProduce))
	}
	if c.DeadLetterTopic != "" && c.DeadLetterTopic == c.DefaultTopic {
		errs = append(errs, errors.New("dead-letter topic must differ from the default topic"))
	}
	return errors.Join(errs...)
}
