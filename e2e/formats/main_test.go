// Package formats holds the end-to-end tests of the record formats: JSON,
// Avro, Protobuf and JSON Schema through a private schema registry,
// CloudEvents, and the shapes of Debezium-style change events.
package formats

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

func TestMain(m *testing.M) { e2e.Main(m) }
