package publisher

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

func badAt(lsn pglogrepl.LSN) replication.Message {
	return replication.Message{Kind: replication.KindBad, WALStart: lsn, Bad: replication.BadEvent{
		LSN: lsn, Table: "public.outbox", ID: "7", Reason: `column "payload" is NULL`,
		Columns: []replication.ColumnText{{Name: "id", Value: []byte("7")}, {Name: "payload", Null: true}},
	}}
}

func TestPipelineBadEventHaltsNamingTheSkip(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- badAt(0x500)
	err := h.result()
	var be *BadEventError
	if !errors.As(err, &be) || !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), "--skip-bad-event 0/500") ||
		!strings.Contains(err.Error(), "--dead-letter-topic") {
		t.Fatalf("Run() = %v, want a BadEventError naming --skip-bad-event 0/500 and --dead-letter-topic", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %s past a bad event", got)
	}
	if !halt.Is(err) {
		t.Fatal("a bad event without a dead-letter topic must halt, not restart")
	}
}

// TestPipelineSkipsOnlyTheNamedBadEvent: --skip-bad-event skips the bad
// event at that LSN, its transaction's other events are published, and a
// bad event at another LSN still halts.
func TestPipelineSkipsOnlyTheNamedBadEvent(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SkipBadEvents = []pglogrepl.LSN{0x500}
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- badAt(0x500)
	h.in <- event(2, "a", "t")
	h.in <- commit(2000)
	r1, r2 := h.next(), h.next()
	h.prod.ack(r1)
	h.prod.ack(r2)
	h.waitConfirmed(2000)
	h.in <- begin()
	h.in <- badAt(0x600)
	if err := h.result(); !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), "--skip-bad-event 0/500 --skip-bad-event 0/600") {
		t.Fatalf("Run() = %v, want a halt on the bad event at 0/600 naming both skips", err)
	}
	if n := counterValue(t, h.p.m.BadEvents.WithLabelValues("skipped")); n != 1 {
		t.Fatalf("skipped %v bad events, want 1", n)
	}
}

// TestPipelineBadEventDeadLettered: with a dead-letter topic the bad event
// goes there with its raw columns and origin, counted in its transaction:
// nothing is confirmed before the events before it are acknowledged.
func TestPipelineBadEventDeadLettered(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeadLetterTopic = "dlq"
	dlq := &fakeDLQ{}
	h := startPipeline(t, cfg, dlq)
	b := begin()
	b.Begin.Xid = 42
	h.in <- b
	h.in <- event(1, "a", "t")
	h.in <- badAt(0x500)
	h.in <- commit(2000)
	r1 := h.next()
	h.in <- begin()
	h.in <- event(3, "a", "t")
	h.in <- commit(3000)
	r3 := h.next() // the stream went on past the bad event
	h.prod.ack(r3)
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %s before the event ahead of the bad one was acknowledged", got)
	}
	h.prod.ack(r1)
	h.waitConfirmed(3000)
	h.waitInFlight(0) // the dead-lettered record gave back exactly the room it took
	dlq.mu.Lock()
	defer dlq.mu.Unlock()
	if len(dlq.got) != 1 {
		t.Fatalf("%d records dead-lettered, want 1", len(dlq.got))
	}
	r := dlq.got[0]
	var cols map[string]*string
	if err := json.Unmarshal(r.Value, &cols); err != nil || cols["payload"] != nil || cols["id"] == nil || *cols["id"] != "7" {
		t.Fatalf("dead-letter value %s, want the raw columns (payload null, id 7)", r.Value)
	}
	want := map[string]string{kafka.HeaderDLQSourceLSN: "0/500", kafka.HeaderDLQSourceXid: "42", kafka.HeaderDLQSourceTable: "public.outbox", kafka.HeaderDLQEventID: "7"}
	for _, hd := range r.Headers {
		if w, ok := want[hd.Key]; ok && w == string(hd.Value) {
			delete(want, hd.Key)
		}
	}
	if len(want) != 0 {
		t.Fatalf("dead-letter headers %v lack %v", r.Headers, want)
	}
	if !errors.Is(r.Err, kafka.ErrPoison) || !strings.Contains(r.Err.Error(), "is NULL") {
		t.Fatalf("dead-letter cause %v, want the reason", r.Err)
	}
}

// TestPipelineRejectedMessagesAreCountedAndSkipped: a rejected message is
// counted and its transaction confirmed as usual.
func TestPipelineRejectedMessagesAreCountedAndSkipped(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- replication.Message{Kind: replication.KindRejected, Rejected: replication.Rejected{LSN: 0x500, Reason: replication.RejectBadMAC}}
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	h.prod.ack(h.next())
	h.waitConfirmed(2000)
	if n := counterValue(t, h.p.m.RejectedMessages.WithLabelValues(replication.RejectBadMAC)); n != 1 {
		t.Fatalf("rejected %v, want 1", n)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestPipelineOversizedEventIsBadWithoutDeadLetterTopic: without a
// dead-letter topic an event over the record limit halts naming the skip,
// and with the skip its transaction's other events are published.
func TestPipelineOversizedEventIsBadWithoutDeadLetterTopic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxRecordBytes = 1000
	big := event(2, "a", "t")
	big.WALStart = 0x700
	big.Event.Payload = []byte(`"` + strings.Repeat("x", 2000) + `"`)
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- big
	h.prod.ack(h.next()) // the halt publishes what came before first
	if err := h.result(); !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), "--skip-bad-event 0/700") ||
		!strings.Contains(err.Error(), "max message bytes") {
		t.Fatalf("Run() = %v, want a bad event naming the size and --skip-bad-event 0/700", err)
	}
	cfg.SkipBadEvents = []pglogrepl.LSN{0x700}
	h = startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- big
	h.in <- event(3, "a", "t")
	h.in <- commit(2000)
	r1, r3 := h.next(), h.next()
	if r1.OutboxID != 1 || r3.OutboxID != 3 {
		t.Fatalf("sent ids %d, %d; want 1 and 3 around the skipped one", r1.OutboxID, r3.OutboxID)
	}
}

// A bad event going to the dead-letter topic never waits for room: the
// budget may be full of events the stream handed over after it, which wait
// in the channel for this very goroutine — waiting would hang for good.
func TestPipelineBadEventDeadLetteredWhenTheBudgetIsFull(t *testing.T) {
	bad := badAt(0x500)
	big := bigEvent(2, 5000)
	cfg := DefaultConfig()
	cfg.DeadLetterTopic = "dlq"
	cfg.MaxInFlightBytes = bad.Bad.Size() + eventCost(big) // full once both are handed over
	dlq := &fakeDLQ{}
	h := startPipeline(t, cfg, dlq)
	h.in <- begin()
	if !h.p.TryAcquire(bad.Bad.Size()) { // as the stream does for a bad event
		t.Fatal("no room for the bad event")
	}
	bad.Budgeted = bad.Bad.Size()
	h.in <- bad
	h.handOver(big)
	h.in <- commit(2000)
	r := h.next() // the event behind the bad one went on to Kafka
	if r.OutboxID != 2 {
		t.Fatalf("record %d sent, want 2", r.OutboxID)
	}
	h.prod.ack(r)
	h.waitConfirmed(2000)
	h.waitInFlight(0)
	dlq.mu.Lock()
	defer dlq.mu.Unlock()
	if len(dlq.got) != 1 {
		t.Fatalf("%d records dead-lettered, want 1", len(dlq.got))
	}
}

// TestPipelineEventSettingAReservedHeaderIsBad: an event whose own headers
// name one outboxd sets is a bad event, not a record carrying the name
// twice, whichever source made it; an event with the writer's own headers
// gets outboxd's headers once each.
func TestPipelineEventSettingAReservedHeaderIsBad(t *testing.T) {
	for _, name := range []string{outbox.HeaderOrigin, outbox.HeaderOutboxID, "ce_id"} {
		h := startPipeline(t, DefaultConfig(), nil)
		h.in <- begin()
		m := event(1, "a", "t")
		m.WALStart = 0x500
		m.Event.Headers = []replication.Header{{Key: "traceparent", Value: "x"}, {Key: name, Value: "forged"}}
		h.in <- m
		if err := h.result(); !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "--skip-bad-event 0/500") {
			t.Fatalf("%s: Run() = %v, want a bad event naming the header and --skip-bad-event 0/500", name, err)
		}
	}
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	m := event(1, "a", "t")
	m.Event.EventType = "T"
	m.Event.Headers = []replication.Header{{Key: "traceparent", Value: "x"}, {Key: "Outbox-Id", Value: "other name"}}
	h.in <- m
	h.in <- commit(2000)
	count := map[string]int{}
	for _, hd := range h.next().Headers {
		count[hd.Key]++
	}
	for _, k := range []string{outbox.HeaderOutboxID, outbox.HeaderAggregateID, outbox.HeaderEventType, "traceparent", "Outbox-Id"} {
		if count[k] != 1 {
			t.Errorf("header %s occurs %d times, want once: %v", k, count[k], count)
		}
	}
}

// A row routed to the checkpoint topic is a bad event, never produced there:
// keyed as a checkpoint, it would be read back as one at the next start.
func TestPipelineEventRoutedToTheCheckpointTopicIsBad(t *testing.T) {
	cfg := DefaultConfig()
	cfg.CheckpointTopic = "outboxd.checkpoints"
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	m := event(1, testID.Key(), "outboxd.checkpoints")
	m.WALStart = 0x600
	h.in <- m
	if err := h.result(); !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), "checkpoint topic") || !strings.Contains(err.Error(), "--skip-bad-event 0/600") {
		t.Fatalf("Run() = %v, want a bad event naming the checkpoint topic and --skip-bad-event 0/600", err)
	}
	if n := h.prod.numSent(); n != 0 {
		t.Fatalf("%d records sent, want none to the checkpoint topic", n)
	}
}
