// Package operations holds the end-to-end tests of running outboxd: its
// start and its error messages, /metrics, /healthz, /readyz and outboxd
// status, outboxd audit and the audit loop, the polling source.
package operations

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
