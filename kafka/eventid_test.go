package kafka

import (
	"errors"
	"strings"
	"testing"
)

// An event with a uuid id is named by it in errors, not as outbox id 0.
func TestErrorsNameAUUIDEvent(t *testing.T) {
	const id = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	cause := errors.New("boom")
	for _, err := range []error{
		&PoisonError{EventID: id, Topic: "t", Err: cause},
		&ProduceError{EventID: id, Topic: "t", Err: cause},
	} {
		if !strings.Contains(err.Error(), "outbox id "+id+" ") {
			t.Errorf("%T: %q does not name event %s", err, err, id)
		}
	}
	if got := (&ProduceError{OutboxID: 7, Topic: "t", Err: cause}).Error(); !strings.Contains(got, "outbox id 7 ") {
		t.Errorf("integer id: %q", got)
	}
}
