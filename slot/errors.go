package slot

import (
	"errors"

	"github.com/outboxd/outboxd/halt"
)

// Sentinel errors. Functions of this package return them wrapped in an *Error
// whose message explains the problem and its fix; test with errors.Is.
var (
	// ErrInvalidConfig: a Config field is empty or not a valid identifier.
	ErrInvalidConfig = errors.New("invalid slot configuration")
	// ErrWALLevel: wal_level is not "logical", so logical decoding is off.
	ErrWALLevel = errors.New("wal_level is not logical")
	// ErrTableMissing: the outbox table does not exist, or the relation of
	// that name is not a table (a view, say).
	ErrTableMissing = errors.New("outbox table missing")
	// ErrColumnMissing: the outbox table lacks a column outboxd reads.
	ErrColumnMissing = errors.New("outbox column missing")
	// ErrColumnType: a column outboxd reads has a type it cannot read in
	// that role (a text id, a headers column that is not json).
	ErrColumnType = errors.New("outbox column of the wrong type")
	// ErrTablelessUnsupported: the table-less outbox cannot work here
	// (PostgreSQL before 14, or no outbox_emit function).
	ErrTablelessUnsupported = errors.New("table-less outbox unsupported")
	// ErrNoReplicationRole: the role has neither REPLICATION nor SUPERUSER,
	// so it can neither create a slot nor stream from one.
	ErrNoReplicationRole = errors.New("role lacks REPLICATION")
	// ErrSlotPlugin: a slot of the configured name exists but cannot serve
	// outboxd: it uses another output plugin, is physical, belongs to another
	// database, or is a temporary slot of another session.
	ErrSlotPlugin = errors.New("replication slot unusable")
	// ErrSlotLost: the slot exists but the server removed WAL it still needed
	// (wal_status "lost", typically past max_slot_wal_keep_size), so it can
	// no longer stream.
	ErrSlotLost = errors.New("replication slot lost")
	// ErrSlotMissing: the slot does not exist (and was not to be created).
	ErrSlotMissing = halt.New("replication slot missing")
	// ErrPublicationMissing: the publication does not exist, and either it
	// was not to be created or the slot already exists (a slot older than
	// its publication cannot decode; see Ensure).
	ErrPublicationMissing = errors.New("publication missing")
	// ErrPublicationMismatch: the publication exists but does not publish
	// inserts into the outbox table, or not all of its required columns.
	ErrPublicationMismatch = errors.New("publication does not match")
	// ErrSlotActive: the slot is in use by a client (Drop refuses).
	ErrSlotActive = errors.New("replication slot active")
)

// Error is a problem diagnosed by this package. Its Error text is a complete
// one-line message saying what is wrong and how to fix it; Unwrap returns the
// sentinel (ErrWALLevel, ErrSlotMissing, ...) it belongs to.
type Error struct {
	// Err is the sentinel, or several joined with errors.Join when one
	// message reports two problems (slot and publication both missing).
	Err error
	// Msg is the message, exactly as Error returns it.
	Msg string
	// PID is the process id of the backend using the slot, for
	// ErrSlotActive (and for ErrSlotPlugin when the slot is a temporary slot
	// of another session); 0 otherwise.
	PID int32
}

func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinel, so errors.Is(err, ErrSlotMissing) works.
func (e *Error) Unwrap() error { return e.Err }

func newError(sentinel error, msg string) *Error {
	return &Error{Err: sentinel, Msg: msg}
}
