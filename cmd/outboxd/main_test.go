package main

import (
	"testing"

	"github.com/outboxd/outboxd/internal/e2e"
)

// The end-to-end tests of this package run the binary through internal/e2e,
// the harness the packages under e2e/ share.
func TestMain(m *testing.M) { e2e.Main(m) }
