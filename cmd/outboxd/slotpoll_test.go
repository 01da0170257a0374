package main

import (
	"testing"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/slot"
)

// Everything the slot gauges show comes from the status the poller read:
// a field dropped here would leave a gauge at 0 for ever.
func TestSlotPollCarriesTheSlotGaugesFields(t *testing.T) {
	t.Parallel()
	safe := int64(42)
	got := slotPoll(slot.Status{
		CurrentWALLSN: 1000, ConfirmedFlushLSN: 900, RestartLSN: 800,
		Active: true, WALStatus: "unreserved", SafeWALSize: &safe,
	})
	want := outbox.SlotPoll{ServerWAL: 1000, SlotConfirmed: 900, RestartLSN: 800, Active: true, WALStatus: "unreserved", SafeWALSize: &safe}
	if got != want {
		t.Fatalf("slotPoll = %+v, want %+v", got, want)
	}
	if got := slotPoll(slot.Status{WALStatus: "lost"}); got.SafeWALSize != nil || got.Active {
		t.Fatalf("slotPoll of a lost slot = %+v: want no safe WAL size, not active", got)
	}
}
