package outbox

import "errors"

// An error tells the supervisor what to do about it, the way pgx's errors
// say whether they are SafeToRetry: by a method, found anywhere in its
// chain. The supervisor decides once, from the error alone, and knows no
// source's types:
//
//   - an error with a Halts method that returns true halts the source
//     (a poison event, a missing slot, an unreadable table): Run returns it;
//   - an error implementing Held waits as a standby (another process holds
//     the slot);
//   - ErrRetrySoon starts the next session soon, without counting a restart;
//   - anything else restarts the session with backoff.
//
// The packages that own the errors (kafka, replication, slot, publisher,
// poll) give their halting sentinels a Halts method.

// Halts reports whether err, or an error it wraps, says a restart cannot
// fix it.
func Halts(err error) bool {
	var h interface{ Halts() bool }
	return errors.As(err, &h) && h.Halts()
}
