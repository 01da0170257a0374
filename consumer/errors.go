package consumer

import (
	"errors"
	"fmt"
)

// Error classes, as reported in [Result.Class] and the [HeaderErrorClass]
// header of a dead-letter record.
const (
	ClassDomain    = "domain"
	ClassTransient = "transient"
)

var (
	// ErrDomain matches every error wrapped with [Domain]:
	// errors.Is(err, ErrDomain) tells a permanent failure.
	ErrDomain = errors.New("domain error")

	// ErrNoOutboxID means a message has no outbox-id header, or one that is
	// not a positive decimal integer. It is a domain error.
	ErrNoOutboxID = errors.New("no valid outbox-id header")

	// ErrDuplicateHeader means a message carries the outbox-id or the
	// outbox-origin header more than once. outboxd sets each once and
	// refuses an event whose writer set one, so a second one is not
	// outboxd's, and which of them is cannot be told: deduplicating on
	// either could skip an event as a duplicate of another. It is a domain
	// error.
	ErrDuplicateHeader = errors.New("header occurs more than once")

	// ErrDeadLetter matches a [*DeadLetterError].
	ErrDeadLetter = errors.New("dead-letter publish failed")
)

// DomainError is a permanent failure: retrying cannot help, so the message
// goes to the dead-letter topic at once. Make one with [Domain].
type DomainError struct {
	Err error
}

// Domain marks err as a domain (permanent) error, such as an invalid state
// transition or an unparsable payload. It returns nil for nil.
func Domain(err error) error {
	if err == nil {
		return nil
	}
	return &DomainError{Err: err}
}

// Domainf is Domain(fmt.Errorf(format, args...)).
func Domainf(format string, args ...any) error {
	return &DomainError{Err: fmt.Errorf(format, args...)}
}

func (e *DomainError) Error() string { return e.Err.Error() }

// Unwrap matches both ErrDomain and the cause.
func (e *DomainError) Unwrap() []error { return []error{ErrDomain, e.Err} }

// IsDomain reports whether err is a domain error.
func IsDomain(err error) bool { return errors.Is(err, ErrDomain) }

// DeadLetterError means a message could not be published to its dead-letter
// topic. The message is not done and its offset is not committed, so it is
// processed again after a restart. [Consumer.Run] returns it.
type DeadLetterError struct {
	Topic           string // source topic
	Partition       int32
	Offset          int64
	DeadLetterTopic string
	Cause           error // why the message was being dead-lettered
	Err             error // why the publish failed
}

func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("consumer: publish %s/%d@%d to dead-letter topic %q: %v (it was dead-lettered for: %v); its offset is not committed, restart the consumer once the topic accepts writes",
		e.Topic, e.Partition, e.Offset, e.DeadLetterTopic, e.Err, e.Cause)
}

// Unwrap matches both ErrDeadLetter and the publish error.
func (e *DeadLetterError) Unwrap() []error { return []error{ErrDeadLetter, e.Err} }

// dbError is a failure of the consumer's own statements (begin, dedup,
// commit without a server answer): the database's fault, not the message's.
// It is retried until it succeeds and never dead-letters a message.
type dbError struct {
	op  string
	err error
}

func (e *dbError) Error() string { return fmt.Sprintf("consumer: %s: %v", e.op, e.err) }
func (e *dbError) Unwrap() error { return e.err }
