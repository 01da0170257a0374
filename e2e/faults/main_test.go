// Package faults holds the end-to-end tests of outboxd under server faults:
// Kafka stopped mid-drain, a frozen walsender, a lost replication slot, a
// PostgreSQL rewound or restored from a backup, failover to a standby; and
// outboxd on each supported PostgreSQL major (OUTBOXD_TEST_PG_VERSION, make
// test-pg14).
package faults

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
