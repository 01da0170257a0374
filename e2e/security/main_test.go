// Package security holds the end-to-end tests of secrets and privileges:
// nothing secret in output, TLS and SASL, least-privilege roles, and what a
// role without grants can make outboxd publish.
package security

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
