package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A slot dropped while outboxd was stopped (issue 11): events written in
// between were never read. outboxd run refuses, naming the gap; outboxd
// replay --since … --resume publishes them from the table, then streams on.
// Every row arrives (some twice: the replay starts at a time, consumers
// dedup by outbox-id), in per-key order.
func TestRunSlotDroppedRefusesThenReplayRecovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	d := e.start()
	ctx := context.Background()
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 500, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.delivered(time.Minute)
	d.stop()
	stoppedAt := time.Now().UTC().Add(-time.Second)
	// While outboxd is stopped: new events, and someone drops the slot.
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 300, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	e.exec(`SELECT pg_drop_replication_slot($1)`, e.slot)

	refused := startDaemon(t, e.args()...)
	if code := refused.wait(60 * time.Second); code == 0 || !strings.Contains(refused.out.String(), "gap between the checkpoint and the slot") {
		t.Fatalf("run after the slot was dropped: exit %d\n%s\nwant a refusal naming the gap", code, refused.out.String())
	}
	args := e.args("--since", stoppedAt.Format(time.RFC3339), "--resume")
	args[0] = "replay"
	r := startDaemon(t, args...)
	r.waitLog("rows published again", 60*time.Second)
	r.waitLog("streaming", 60*time.Second)
	if err := e.write(ctx, load{writers: 2, aggregates: 20, total: 200, maxTxn: 5}); err != nil {
		t.Fatal(err)
	}
	v, n := e.delivered(2 * time.Minute)
	t.Logf("slot dropped while stopped, replay --since --resume: %d events: %s", n, v)
	if v.lost != 0 || v.reordered != 0 || v.corrupt != 0 {
		t.Fatalf("after replay: %s", v)
	}
	r.stop()
}
