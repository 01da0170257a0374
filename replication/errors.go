package replication

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/halt"
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
	ErrSlotLost = halt.New("replication slot lost")
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
// as a standby (outbox.Held).
func (e *SlotInUseError) HeldBy() (string, int) { return e.Slot, e.PID }

// Sentinel errors. Every error returned by Decode wraps exactly one of them;
// test with errors.Is.
var (
	// ErrProtocol reports a message that is malformed or that is not allowed
	// where it appears (an Insert outside a transaction, a streaming message,
	// an unknown message type, ...).
	ErrProtocol = errors.New("replication: protocol violation")
	// ErrUnknownRelation reports an Insert for a relation id that no Relation
	// message described.
	ErrUnknownRelation = errors.New("replication: unknown relation")
	// ErrMissingColumn reports an outbox table that lacks a required column.
	ErrMissingColumn = halt.New("replication: missing column")
	// ErrBadValue reports an outbox row with a value that cannot become an
	// Event (a NULL id, an unparsable created_at, ...).
	ErrBadValue = halt.New("replication: bad value")
)

// DecodeError is returned by Decode for a message it cannot interpret. It
// unwraps to ErrProtocol, ErrUnknownRelation or ErrBadValue.
type DecodeError struct {
	// MsgType is the message's type byte ('B', 'I', ...); 0 for an empty
	// message.
	MsgType byte
	// Offset is the position in walData of the field that failed.
	Offset int
	// Err is the sentinel the error wraps.
	Err error
	// Detail says what was wrong.
	Detail string
	// bad is the row, for a bad value in an outbox row (see asBadEvent).
	bad *BadEvent
}

func (e *DecodeError) Error() string {
	kind := strings.TrimPrefix(e.Err.Error(), "replication: ")
	if e.MsgType == 0 {
		return "replication: " + kind + ": " + e.Detail
	}
	return fmt.Sprintf("replication: %s in %s message at offset %d: %s", kind, msgTypeName(e.MsgType), e.Offset, e.Detail)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// MissingColumnError reports an outbox table without one of the required
// columns id, aggregate_id and payload. It unwraps to ErrMissingColumn.
type MissingColumnError struct {
	Schema, Table, Column string
}

func (e *MissingColumnError) Error() string {
	return fmt.Sprintf("replication: outbox table %s.%s has no column %q", e.Schema, e.Table, e.Column)
}

func (e *MissingColumnError) Unwrap() error { return ErrMissingColumn }

// ErrColumnType reports an outbox column whose type outboxd cannot read in
// the role it is mapped to (a text id, a json headers column that is an
// integer, ...).
var ErrColumnType = errors.New("replication: column type")

// ColumnTypeError names a mapped column of the wrong type. It unwraps to
// ErrColumnType.
type ColumnTypeError struct {
	Schema, Table, Column string
	// Role is what the column is mapped to ("id", "headers", ...).
	Role string
	// OID is the column's type OID; Want says which types fit.
	OID  uint32
	Want string
}

func (e *ColumnTypeError) Error() string {
	return fmt.Sprintf("replication: outbox column %s.%s.%q (the %s) has type OID %d: outboxd reads %s there: change the column's type or map another column",
		e.Schema, e.Table, e.Column, e.Role, e.OID, e.Want)
}

func (e *ColumnTypeError) Unwrap() error { return ErrColumnType }

// ErrMessageKey means outbox_emit's messages should be read but outboxd
// cannot authenticate them: the key table (migration 007) is missing or
// unreadable for outboxd's role. Reading on would skip every real event as
// forged, so the service stops with the fix.
var ErrMessageKey = halt.New("outbox_emit key unavailable")

// ErrServerSilent means the server sent nothing, not even a keepalive when
// asked for one, for StreamConfig.ServerTimeout: the connection is half-open
// or the server stopped. Run returns it so that the caller restarts.
var ErrServerSilent = errors.New("replication server silent")
