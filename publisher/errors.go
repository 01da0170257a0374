package publisher

import "errors"

// errNoTopic is the cause of a kafka.PoisonError for a row with no topic and
// no default topic.
var errNoTopic = errors.New("the row has no topic and no --default-topic is set")

// haltError is a sentinel error a restart cannot fix; it says so (Halts),
// so that the supervisor halts instead of restarting (outbox.Halts).
type haltError struct{ msg string }

func (e *haltError) Error() string { return e.msg }

// Halts implements outbox.Halts.
func (e *haltError) Halts() bool { return true }
