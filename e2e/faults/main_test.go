// Package faults holds the end-to-end tests of outboxd under server faults:
// Kafka stopped mid-drain, a frozen walsender, a lost replication slot, a
// PostgreSQL rewound or restored from a backup.
package faults

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
