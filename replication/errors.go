package replication

import (
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/slot"
)

var (
	// ErrSlotInUse means another process streams from the slot. The slot is
	// outboxd's singleton lock: the caller waits as a standby.
	ErrSlotInUse = errors.New("replication slot in use")
	// ErrSlotMissing means the slot does not exist. It is slot.ErrSlotMissing:
	// one sentinel, whichever package noticed.
	ErrSlotMissing = slot.ErrSlotMissing
	// ErrSlotLost means the slot was invalidated: the WAL it needed is gone,
	// so events after its position cannot be read any more.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrStreamEnded means the server ended the replication stream.
	ErrStreamEnded = errors.New("replication stream ended")
)

// SlotInUseError says which process holds the slot.
type SlotInUseError struct {
	Slot string
	PID  int // 0 when unknown
}

func (e *SlotInUseError) Error() string {
	return fmt.Sprintf("replication: slot %q is active for PID %d", e.Slot, e.PID)
}

// Unwrap lets errors.Is(err, ErrSlotInUse) match.
func (e *SlotInUseError) Unwrap() error { return ErrSlotInUse }

// HeldBy names the slot and the process holding it: the supervisor waits
// as a standby (publisher.Held).
func (e *SlotInUseError) HeldBy() (string, int) { return e.Slot, e.PID }
