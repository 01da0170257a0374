// Package memory holds the end-to-end tests of outboxd's memory: peak RSS
// within README's bound while Kafka is away, with large transactions and
// with logical decoding messages that are not outboxd's; and the memory
// table of make bench-memory. They run a binary built without the race
// detector, whose memory is the real one.
package memory

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
