package poll

import (
	"strings"
	"testing"

	"github.com/outboxd/outboxd/outbox"
)

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.ConnString = "postgres://x"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults with a DSN: %v", err)
	}
	bad := Config{Interval: -1, BatchSize: 0, Workers: 100, RestartBackoffMin: 2, RestartBackoffMax: 1, Mapping: outbox.Mapping{DefaultTopic: "x"}, DeadLetterTopic: "x"}
	err := bad.Validate()
	for _, want := range []string{"no PostgreSQL connection string", "outbox table must be named", "poll interval must be > 0",
		"poll batch size must be in 1..100000", "poll workers must be in 1..64", "shutdown timeout must be > 0",
		"restart backoff must satisfy", "dead-letter topic must differ"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to say %q", err, want)
		}
	}
}
