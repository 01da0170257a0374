// Package exactlyonce holds the end-to-end tests of Kafka transactions and
// of the checkpoints both delivery modes rely on: exactly-once through
// kill -9, PostgreSQL restarts, Kafka faults and a stream cut inside a
// transaction, a zombie fenced or its late checkpoint ignored, a gap
// between checkpoint and slot refused. They were the longest part of the
// delivery tests; a package of their own runs beside the rest.
package exactlyonce

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
