package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/publisher"
	"github.com/outboxd/outboxd/replication"
	"github.com/outboxd/outboxd/slot"
)

// Rule: each error says whether it halts a source; the list is the one the
// CDC service and the poller each kept before (their isFatal), and errors
// that a restart can fix do not halt. Fails if a sentinel loses its Halts.
func TestErrorsSayWhetherTheyHalt(t *testing.T) {
	halting := []error{
		kafka.ErrPoison, kafka.ErrFenced, kafka.ErrTxnTimeout, kafka.ErrNotAuthorized,
		&kafka.PoisonError{Topic: "t", Err: errors.New("too large")},
		&kafka.ACLError{Operation: "Write", Err: errors.New("denied")},
		replication.ErrSlotMissing, slot.ErrSlotMissing, replication.ErrSlotLost,
		replication.ErrMissingColumn, replication.ErrMessageKey, replication.ErrBadValue,
		&replication.MissingColumnError{Column: "id"},
		&replication.DecodeError{Err: replication.ErrBadValue},
		publisher.ErrGap, publisher.ErrRewind,
		poll.ErrSchema, poll.ErrBadRow,
	}
	for _, err := range halting {
		if !halt.Is(fmt.Errorf("session: %w", err)) {
			t.Errorf("%v does not halt", err)
		}
	}
	restarting := []error{
		kafka.ErrProduce, &kafka.ProduceError{Err: errors.New("broker down")},
		replication.ErrSlotInUse, replication.ErrServerSilent, replication.ErrStreamEnded,
		replication.ErrColumnType, replication.ErrProtocol, outbox.ErrHook,
		errors.New("connection reset"), context.Canceled,
	}
	for _, err := range restarting {
		if halt.Is(fmt.Errorf("session: %w", err)) {
			t.Errorf("%v halts, want a restart", err)
		}
	}
}

// Rule: the supervisor halts on an error that says so, waits as a standby
// on one that says another process holds what it needs, and restarts on
// anything else — knowing no source's types.
func TestSupervisorDecidesFromTheErrorAlone(t *testing.T) {
	sup := outbox.NewSupervisor(outbox.SupervisorConfig{
		RestartBackoffMin: time.Millisecond, RestartBackoffMax: time.Millisecond,
		StandbyPollInterval: time.Millisecond, ShutdownTimeout: time.Second,
	}, zap.NewNop(), nil)
	halt := fmt.Errorf("wrapped: %w", replication.ErrSlotLost)
	var sessions []error
	sawStandby := false
	err := sup.Run(context.Background(), func(stop, hard context.Context) (bool, error) {
		switch len(sessions) {
		case 0:
			sessions = append(sessions, errors.New("broker down"))
		case 1:
			sessions = append(sessions, &replication.SlotInUseError{Slot: "s", PID: 7})
		default:
			sawStandby = sup.State() == outbox.StateStandby
			sessions = append(sessions, halt)
		}
		return false, sessions[len(sessions)-1]
	})
	if !errors.Is(err, halt) || len(sessions) != 3 {
		t.Fatalf("Run = %v after %d sessions, want the halting error after 3", err, len(sessions))
	}
	if !sawStandby {
		t.Fatal("no standby after the slot-in-use error")
	}
}
