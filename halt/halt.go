// Package halt is how an error says that a restart cannot fix it, the way
// pgx's errors say whether they are SafeToRetry: by a method, found anywhere
// in the error's chain. The packages that own such errors (kafka,
// replication, slot, publisher, poll, format) give them a Halts method,
// usually by making their sentinels with New; the supervisor (package
// outbox) asks Is and halts the source instead of restarting it.
//
// It is a leaf: it imports nothing of outboxd, so that every package can
// declare its halting errors without pulling in the runtime.
package halt

import "errors"

// Is reports whether err, or an error it wraps, says a restart cannot fix
// it: the first error in the chain with a Halts method decides.
func Is(err error) bool {
	var h interface{ Halts() bool }
	return errors.As(err, &h) && h.Halts()
}

// New returns a sentinel error with the message msg that halts (Is reports
// true for it and for every error wrapping it). Each call returns a
// distinct error.
func New(msg string) error { return &sentinel{msg} }

// sentinel is an error a restart cannot fix.
type sentinel struct{ msg string }

func (e *sentinel) Error() string { return e.msg }

// Halts says a restart cannot fix it (see Is).
func (e *sentinel) Halts() bool { return true }
