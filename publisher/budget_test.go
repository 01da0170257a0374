package publisher

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/replication"
)

// handOver does what the Stream does with an event: it takes room from the
// pipeline's budget (replication.Budget), waiting for Freed, and hands the
// event over with what it took.
func (h *harness) handOver(m replication.Message) {
	h.t.Helper()
	var b replication.Budget = h.p
	n := m.Event.Size()
	deadline := time.After(5 * time.Second)
	for !b.TryAcquire(n) {
		select {
		case <-b.Freed():
		case <-deadline:
			h.t.Fatal("no room in the budget within 5 s")
		}
	}
	m.Budgeted = n
	h.in <- m
}

// waitInFlight waits until the budget holds want bytes.
func (h *harness) waitInFlight(want int64) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, got := h.p.lim.inFlight()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("budget holds %d bytes, want %d", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func eventCost(m replication.Message) int64 { return m.Event.Size() }

func bigEvent(id int64, size int) replication.Message {
	m := event(id, "a", "t")
	m.Event.Payload = make([]byte, size)
	return m
}

// The hand-off is in the budget: an event handed over holds room before the
// pipeline even reads it, so a stream whose events wait in the channel
// cannot take more than the budget. Fails if Pipeline.TryAcquire ignores the
// budget (the channel then holds any number of events, whatever their size).
func TestBudgetCountsEventsWaitingInTheChannel(t *testing.T) {
	cfg := DefaultConfig()
	cost := eventCost(bigEvent(1, 10_000))
	cfg.MaxInFlightBytes = 3*cost + 100
	h := startPipeline(t, cfg, nil)
	var b replication.Budget = h.p
	took := 0
	for took < 10 && b.TryAcquire(cost) {
		took++
	}
	if took != 3 {
		t.Fatalf("the budget gave room to %d events of 10 KB, want 3", took)
	}
	// One event larger than the whole budget goes through, alone.
	h2 := startPipeline(t, cfg, nil)
	if !h2.p.TryAcquire(10*cfg.MaxInFlightBytes) || h2.p.TryAcquire(1) {
		t.Fatal("an event larger than the budget must get room alone when nothing else holds any")
	}
}

// An event handed over holds the decoded event's size until the pipeline
// makes its record; from then the record's cost, until Kafka acknowledges
// it. Fails if produce does not resize (the budget would then drift from
// what is held) or if handleResult releases something else.
func TestBudgetFollowsAnEventToItsAck(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	m := bigEvent(1, 5000)
	h.handOver(m)
	h.in <- commit(2000)
	r := h.next()
	h.waitInFlight(recordCost(r))
	if recordCost(r) == m.Event.Size() {
		t.Fatalf("test needs a record whose cost differs from the event's (%d)", recordCost(r))
	}
	h.prod.ack(r)
	h.waitInFlight(0)
	h.waitConfirmed(2000)
}

// The pipeline holds a transaction's records back until its commit; when
// the stream waits for room, they must go at once, or nothing would ever be
// acknowledged to free it. Fails (the stream waits for ever) without the
// flush on lim.wanted / streamWaiting.
func TestBudgetStreamWaitingFlushesHeldBackRecords(t *testing.T) {
	cfg := DefaultConfig()
	cost := eventCost(bigEvent(1, 10_000))
	cfg.MaxInFlightBytes = 2*cost + 100
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.handOver(bigEvent(1, 10_000))
	h.handOver(bigEvent(2, 10_000))
	// The budget is spent and the transaction open: the third hand-off
	// waits, which must send the first two.
	third := make(chan struct{})
	go func() {
		defer close(third)
		h.handOver(bigEvent(3, 10_000))
	}()
	r1 := h.next()
	h.next()
	select {
	case <-third:
		t.Fatal("the third event got room before anything was acknowledged")
	case <-time.After(20 * time.Millisecond):
	}
	h.prod.ack(r1)
	select {
	case <-third:
	case <-time.After(5 * time.Second):
		t.Fatal("the third event got no room after an acknowledgement")
	}
}

// Skipped events (already in Kafka: exactly-once resume) release what the
// stream took. Fails if the skip path forgets the release: the budget then
// leaks until the stream wedges.
func TestBudgetSkippedEventsReleaseTheirRoom(t *testing.T) {
	h := &harness{t: t, prod: newFakeProducer(), in: make(chan replication.Message, 100), err: make(chan error, 1)}
	h.p = NewPipeline(DefaultConfig(), zap.NewNop(), h.prod, nil, nil, 1000, nil)
	if err := h.p.useCheckpoints(newCheckpointing("cp", Identity{}, &Checkpoint{EndLSN: 5000}, 1000)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { h.err <- h.p.Run(ctx, h.in) }()
	b := begin()
	b.Begin.FinalLSN = 1500 // before the checkpoint: skipped
	h.in <- b
	h.handOver(bigEvent(1, 5000))
	h.in <- commit(2000)
	h.waitInFlight(0)
}

var _ replication.Budget = (*Pipeline)(nil)

// Exactly-once: closing a Kafka transaction drains what was produced, not
// the events of the next transaction the stream already handed over (they
// hold room but wait in the channel for the drain to end). Fails — the
// commit never comes — if drain waits for every event holding room.
func TestBudgetDrainIgnoresEventsStillInTheChannel(t *testing.T) {
	h := startCheckpointed(t, ExactlyOnce, nil)
	h.p.cfg.TxnMaxEvents = 1
	hh := &harness{t: t, p: h.p, in: h.in}
	h.in <- beginAt(1900)
	hh.handOver(bigEvent(1, 100))
	h.in <- commit(2000)
	h.in <- beginAt(2100)
	hh.handOver(bigEvent(2, 100)) // waits in the channel during the commit
	h.prod.ack(h.next())
	h.prod.ack(h.next()) // the checkpoint
	select {
	case <-h.prod.commits:
	case <-time.After(5 * time.Second):
		t.Fatal("no Kafka commit: the drain waited for an event still in the channel")
	}
}

// An event the pipeline finds it cannot publish (here: no topic), skipped
// by --skip-bad-event, gives back the room the stream took for it; leaked,
// a run of such events would wedge the stream.
func TestBudgetBadEventsReleaseTheirRoom(t *testing.T) {
	h := &harness{t: t, prod: newFakeProducer(), in: make(chan replication.Message, 100), err: make(chan error, 1)}
	cfg := DefaultConfig()
	ev := bigEvent(1, 5000)
	ev.Event.Topic = ""
	ev.WALStart = 1234
	cfg.SkipBadEvents = []pglogrepl.LSN{ev.WALStart}
	h.p = NewPipeline(cfg, zap.NewNop(), h.prod, nil, nil, 1000, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { h.err <- h.p.Run(ctx, h.in) }()
	h.in <- begin()
	h.handOver(ev)
	h.in <- commit(2000)
	h.waitInFlight(0)
}
