package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/replication"
)

// Each way a database goes back in time is refused, and only a checkpoint
// provably on the server's history lets outboxd skip.
func TestCheckHistory(t *testing.T) {
	cp := func(tli int32, end pglogrepl.LSN) *Checkpoint {
		return &Checkpoint{SystemID: "7", Slot: "s", Timeline: tli, EndLSN: end, MaxOutboxID: 2500,
			CommitTime: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)}
	}
	hist := func(tli int32, flushed pglogrepl.LSN, ends map[int32]pglogrepl.LSN) *replication.History {
		return &replication.History{SystemID: "7", Timeline: tli, Flushed: flushed, Ends: ends}
	}
	for _, c := range []struct {
		name    string
		cp      *Checkpoint
		h       *replication.History
		slot    pglogrepl.LSN
		newSlot bool
		want    string // "" = may skip, else the kind
	}{
		{"same timeline, server ahead", cp(1, 5000), hist(1, 9000, nil), 4000, false, ""},
		{"same timeline, checkpoint ahead: restore", cp(1, 5000), hist(1, 3000, nil), 2000, false, RewindRestore},
		{"new slot below the checkpoint, WAL moved past it again: restore", cp(1, 5000), hist(1, 9000, nil), 3000, true, RewindRestore},
		{"new slot above the checkpoint: not a rewind (checkGap's)", cp(1, 5000), hist(1, 9000, nil), 6000, true, ""},
		{"old timeline, switched after the checkpoint", cp(1, 5000), hist(2, 9000, map[int32]pglogrepl.LSN{1: 6000}), 4000, false, ""},
		{"old timeline, switched at the checkpoint", cp(1, 5000), hist(2, 9000, map[int32]pglogrepl.LSN{1: 5000}), 4000, false, ""},
		{"old timeline, switched before the checkpoint: fork", cp(1, 5000), hist(2, 9000, map[int32]pglogrepl.LSN{1: 4500}), 4000, false, RewindFork},
		{"checkpoint on a timeline the server never had", cp(3, 5000), hist(2, 9000, map[int32]pglogrepl.LSN{1: 4500}), 4000, false, RewindFork},
		{"old checkpoint without a timeline, server on 1", cp(0, 5000), hist(1, 9000, nil), 4000, false, ""},
		{"old checkpoint without a timeline, server forked before it", cp(0, 5000), hist(2, 9000, map[int32]pglogrepl.LSN{1: 4000}), 4000, false, RewindFork},
	} {
		err := checkHistory(c.cp, c.h, c.slot, c.newSlot, "cp")
		var rw *RewindError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want a skip allowed", c.name, err)
		case c.want != "" && !errors.As(err, &rw):
			t.Errorf("%s: %v, want a *RewindError", c.name, err)
		case c.want != "" && (rw.Kind != c.want || !errors.Is(err, ErrRewind) || !halt.Is(err)):
			t.Errorf("%s: kind %q (fatal %v), want %q", c.name, rw.Kind, halt.Is(err), c.want)
		case c.want != "":
			msg := err.Error()
			for _, s := range []string{ResetCommand, "2500", "nothing written since has been published", "committed 2026-12-02T01:00:00Z"} {
				if !strings.Contains(msg, s) {
					t.Errorf("%s: message lacks %q: %s", c.name, s, msg)
				}
			}
		}
	}
}

// A refusal recorded in the checkpoint refuses again, whatever the server
// says now; the fields survive the JSON round trip, and an old checkpoint
// without them reads as generation 0, no id high mark.
func TestCheckpointRecordsRefusal(t *testing.T) {
	c := Checkpoint{SystemID: "7", Timeline: 1, EndLSN: 5000, MaxOutboxID: 42, Generation: 3, Refused: "refused before"}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.MaxOutboxID != 42 || back.Generation != 3 || back.Refused != "refused before" {
		t.Fatalf("round trip: %+v", back)
	}
	err = checkHistory(back, &replication.History{SystemID: "7", Timeline: 1, Flushed: 9000}, 6000, false, "cp")
	if !errors.Is(err, ErrRewind) || !strings.Contains(err.Error(), "refused before") {
		t.Fatalf("recorded refusal: %v", err)
	}
	old, err := ParseCheckpoint([]byte(`{"system_id":"7","database":"d","slot":"s","timeline":1,"end_lsn":"0/1388","written_at":"2026-12-01T00:00:00Z"}`))
	if err != nil || old.Generation != 0 || old.MaxOutboxID != 0 || old.Refused != "" {
		t.Fatalf("old checkpoint: %+v %v", old, err)
	}
}

// The history is read over a connection of its own, which a failover can
// take to another server than the stream's: such a history is not judged
// (it could pass on the old primary while the stream reads a fork); the
// session restarts and reads both again.
func TestServiceJudgesOnlyTheStreamsServersHistory(t *testing.T) {
	src := &fakeSource{start: 1000}
	sysID, tli, _, _ := src.System()
	cp := &Checkpoint{SystemID: sysID, Timeline: tli, EndLSN: 5000}
	for _, h := range []replication.History{
		{SystemID: "another system", Timeline: tli, Flushed: 9000},                                    // would be "another system: not ours to judge"
		{SystemID: sysID, Timeline: tli + 1, Flushed: 9000, Ends: map[int32]pglogrepl.LSN{tli: 9000}}, // would pass: the fork is after the checkpoint
	} {
		svc := &Service{cfg: DefaultConfig(), deps: Deps{ReadHistory: func(context.Context) (*replication.History, error) { return &h, nil }}}
		err := svc.checkHistory(context.Background(), cp, src)
		if !errors.Is(err, errSourceOpen) || errors.Is(err, ErrRewind) {
			t.Errorf("history of %s timeline %d, stream on %s timeline %d: %v, want a restart", h.SystemID, h.Timeline, sysID, tli, err)
		}
	}
}
