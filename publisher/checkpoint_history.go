package publisher

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/replication"
)

// ErrRewind means the database went back in time behind outboxd's
// checkpoint (a restore from a backup, a point-in-time recovery, the
// promotion of a standby that had not received everything): outboxd refuses
// to stream rather than skip what the checkpoint says is in Kafka. A
// *RewindError wraps it.
var ErrRewind = halt.New("the database went back in time")

// ResetCommand is what an operator runs after a rewind.
const ResetCommand = "outboxd checkpoint reset --to-current-history"

// Rewind kinds.
const (
	// RewindRestore: the checkpoint is ahead of the server's WAL on the same
	// timeline, or the slot is new and was created below the checkpoint.
	RewindRestore = "restore"
	// RewindRecorded: an earlier start refused and recorded it in the
	// checkpoint.
	RewindRecorded = "recorded"
	// RewindFork: the server's history left the checkpoint's timeline before
	// the checkpoint's position (PITR, a promoted standby).
	RewindFork = "fork"
)

// RewindError is the refusal after a rewind: one message saying what
// happened, what it means and how to go on.
type RewindError struct {
	Kind       string
	Checkpoint Checkpoint
	Server     replication.History
	// SwitchPoint is where the server's history left the checkpoint's
	// timeline (RewindFork; 0 when the timeline is not in its history).
	SwitchPoint pglogrepl.LSN
	// SlotStart is the slot's position; NewSlot: outboxd created it.
	SlotStart pglogrepl.LSN
	NewSlot   bool
	Topic     string
}

func (e *RewindError) Unwrap() error { return ErrRewind }

func (e *RewindError) Error() string {
	cp := &e.Checkpoint
	if e.Kind == RewindRecorded {
		return cp.Refused + " (recorded in the checkpoint at " + cp.WrittenAt.UTC().Format(time.RFC3339) + ": every start refuses until the reset)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%v: ", ErrRewind)
	switch {
	case e.Kind == RewindFork && e.SwitchPoint != 0:
		fmt.Fprintf(&b, "the server's WAL history forked (a point-in-time recovery or the promotion of a standby): it left timeline %d at %s and is now on timeline %d at %s, but outboxd's checkpoint is at %s on timeline %d",
			cp.Timeline, e.SwitchPoint, e.Server.Timeline, e.Server.Flushed, cp.EndLSN, cp.Timeline)
	case e.Kind == RewindFork:
		fmt.Fprintf(&b, "outboxd's checkpoint is at %s on timeline %d, a timeline this server's history (timeline %d at %s) never went through (a restore of an older backup or a fork)",
			cp.EndLSN, cp.Timeline, e.Server.Timeline, e.Server.Flushed)
	case e.NewSlot && e.SlotStart < cp.EndLSN && e.Server.Flushed >= cp.EndLSN:
		fmt.Fprintf(&b, "the database was restored from a backup: replication slot %q was created at %s, below outboxd's checkpoint at %s on timeline %d, so the WAL was behind the checkpoint when it was created (it has moved past it since, to %s)",
			cp.Slot, e.SlotStart, cp.EndLSN, cp.Timeline, e.Server.Flushed)
	default:
		fmt.Fprintf(&b, "the database was restored from a backup: its WAL ends at %s on timeline %d, behind outboxd's checkpoint at %s",
			e.Server.Flushed, e.Server.Timeline, cp.EndLSN)
	}
	if !cp.CommitTime.IsZero() {
		fmt.Fprintf(&b, " (the last transaction outboxd had read by then committed %s)", cp.CommitTime.UTC().Format(time.RFC3339))
	}
	b.WriteString(". What it means: the events published from the restore point up to the checkpoint are in Kafka and were consumed, but are no longer in the database; nothing written since has been published")
	if cp.MaxOutboxID > 0 {
		fmt.Fprintf(&b, "; the outbox id sequence went back too and would hand out ids up to %d again, which consumers have seen", cp.MaxOutboxID)
	}
	fmt.Fprintf(&b, ". outboxd refuses to stream, so that nothing is skipped. To go on, run %q with the same settings as outboxd run", ResetCommand)
	if cp.MaxOutboxID > 0 {
		fmt.Fprintf(&b, " (it moves the outbox id sequence past %d and starts the checkpoint in %q over on this history)", cp.MaxOutboxID, e.Topic)
	} else {
		fmt.Fprintf(&b, " (it starts the checkpoint in %q over on this history)", e.Topic)
	}
	b.WriteString(", then start outboxd again")
	return b.String()
}

// checkHistory tells whether everything before the checkpoint is on the
// server's history; only then may transactions before it be skipped. newSlot
// says outboxd created the slot since the checkpoint was written: a slot
// created below the checkpoint proves the WAL was behind it at the time,
// even when it has moved past it since (a restore on the same timeline).
func checkHistory(cp *Checkpoint, h *replication.History, slotStart pglogrepl.LSN, newSlot bool, topic string) error {
	if cp == nil || h == nil || cp.SystemID != h.SystemID {
		return nil // no checkpoint, or another system: checkGap's
	}
	if cp.Refused != "" {
		return &RewindError{Kind: RewindRecorded, Checkpoint: *cp, Server: *h, SlotStart: slotStart, NewSlot: newSlot, Topic: topic}
	}
	tli := cp.Timeline
	if tli == 0 {
		tli = 1 // written before checkpoints named their timeline
	}
	e := &RewindError{Checkpoint: *cp, Server: *h, SlotStart: slotStart, NewSlot: newSlot, Topic: topic}
	e.Checkpoint.Timeline = tli
	switch {
	case tli == h.Timeline && cp.EndLSN > h.Flushed:
		e.Kind = RewindRestore
	case tli != h.Timeline && !h.Contains(tli, cp.EndLSN):
		e.Kind, e.SwitchPoint = RewindFork, h.Ends[tli]
	case newSlot && slotStart < cp.EndLSN:
		e.Kind = RewindRestore
	default:
		return nil
	}
	return e
}
