package format

import (
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/kafka"
)

// BadPayloadError means an event's payload cannot be written in the
// configured format: not JSON, or not what its schema says. It is the
// event's fault and retrying cannot help, so it matches kafka.ErrPoison:
// the event is dead-lettered with Error() as the reason, or halts the
// service (naming the --skip-bad-event that skips it).
type BadPayloadError struct {
	Format  Format
	Subject string // "" when no registry is involved
	ID      int    // the schema id (0: none)
	Reason  string
}

func (e *BadPayloadError) Error() string {
	switch {
	case e.ID == 0:
		return fmt.Sprintf("payload is not valid %s: %s", e.Format, e.Reason)
	case e.Subject == "":
		return fmt.Sprintf("payload does not fit the %s schema id %d: %s", e.Format, e.ID, e.Reason)
	}
	return fmt.Sprintf("payload does not fit the %s schema id %d (subject %q): %s", e.Format, e.ID, e.Subject, e.Reason)
}

// Is makes a BadPayloadError a poison event.
func (e *BadPayloadError) Is(target error) bool { return target == kafka.ErrPoison }

// Halts says a restart cannot fix it (halt.Is): the event has to be
// dead-lettered or skipped.
func (e *BadPayloadError) Halts() bool { return true }

// ErrRegistry is what every RegistryError matches.
var ErrRegistry = errors.New("schema registry")

// RegistryError means the schema for a record could not be had: the
// registry did not answer, answered with an error, or the subject has no
// schema (and auto-registration is off). It is transient: the caller
// restarts from its confirmed position, and the event is encoded again
// once the registry answers.
type RegistryError struct {
	Subject string
	Op      string // what was asked: "latest version", "version 3", "id 7", "register"
	Err     error
}

func (e *RegistryError) Error() string {
	if e.Subject == "" {
		return fmt.Sprintf("schema registry: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("schema registry: subject %q: %s: %v", e.Subject, e.Op, e.Err)
}

func (e *RegistryError) Unwrap() []error { return []error{ErrRegistry, e.Err} }

// SchemaError means a schema the registry gave cannot be used (it does
// not parse, or has no message to encode with): fixing it needs a new
// schema version, not this event. Like RegistryError it restarts the
// pipeline; the registry's next version is read after the restart.
type SchemaError struct {
	Format  Format
	Subject string
	ID      int
	Err     error
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("%s schema id %d (subject %q) cannot be used: %v", e.Format, e.ID, e.Subject, e.Err)
}

func (e *SchemaError) Unwrap() error { return e.Err }
