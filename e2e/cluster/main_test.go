// Package cluster holds the end-to-end tests on Kafka clusters of their own:
// broker faults on a private 3-node cluster (TestClusterFaults), many
// deployments on one (TestSharedCluster), and ten outages of a private
// broker (TestRunTenShortKafkaOutagesKeepPerKeyOrder). Every server is
// private, so the package runs beside the others; make test starts it first
// because it is the longest.
package cluster

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
