// Package delivery holds the end-to-end tests of what reaches Kafka and
// when: at-least-once and exactly-once publishing through clean stops,
// kill -9 and restarts, transactions of every size, logical messages, the
// publish hook, malformed events. They use the dev stack's servers (a
// database and topics of their own each) or private ones.
package delivery

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
