package publisher

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/replication"
)

// poisonCause is a payload the encoder refuses (format.BadPayloadError's
// behaviour: it matches kafka.ErrPoison).
type poisonCause struct{}

func (poisonCause) Error() string {
	return "payload does not fit the avro schema id 1: $.qty: want integer"
}
func (poisonCause) Is(target error) bool { return target == kafka.ErrPoison }

// fakeEncoder wraps values in brackets, refuses outbox id 2 as poison, and
// fails with err when set (a registry that does not answer).
type fakeEncoder struct{ err error }

func (f *fakeEncoder) Encode(_ context.Context, r *kafka.Record) error {
	if f.err != nil {
		return f.err
	}
	if r.OutboxID == 2 {
		return poisonCause{}
	}
	r.Value = append(append([]byte("["), r.Value...), ']')
	return nil
}

func TestPipelineEncodesRecords(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Encoder = &fakeEncoder{}
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	r := h.next()
	if string(r.Value) != `[{"n":1}]` {
		t.Fatalf("value %s, want the encoder's", r.Value)
	}
	h.prod.ack(r)
	h.waitConfirmed(2000)
}

// TestPipelineUnencodableEventHaltsNamingTheSkip: a payload the encoder
// refuses is a bad event: without a dead-letter topic it halts naming
// --skip-bad-event at its LSN, and nothing is confirmed past it.
func TestPipelineUnencodableEventHaltsNamingTheSkip(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Encoder = &fakeEncoder{}
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	bad := event(2, "a", "t")
	bad.WALStart = 0x700
	h.in <- bad
	h.prod.ack(h.next())
	err := h.result()
	var be *BadEventError
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "--skip-bad-event 0/700") || !strings.Contains(err.Error(), "$.qty") {
		t.Fatalf("Run() = %v, want a BadEventError naming --skip-bad-event 0/700 and the reason", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %s past the bad event", got)
	}
}

func TestPipelineUnencodableEventDeadLettered(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Encoder = &fakeEncoder{}
	cfg.DeadLetterTopic = "dlq"
	dlq := &fakeDLQ{}
	h := startPipeline(t, cfg, dlq)
	h.in <- begin()
	bad := event(2, "a", "t")
	bad.WALStart = 0x700
	h.in <- bad
	h.in <- event(3, "a", "t")
	h.in <- commit(2000)
	h.prod.ack(h.next())
	h.waitConfirmed(2000)
	h.waitInFlight(0)
	dlq.mu.Lock()
	defer dlq.mu.Unlock()
	if len(dlq.got) != 1 || !errors.Is(dlq.got[0].Err, kafka.ErrPoison) || !strings.Contains(dlq.got[0].Err.Error(), "$.qty") ||
		!strings.Contains(string(dlq.got[0].Value), `"payload":"{\"n\":1}"`) {
		t.Fatalf("dead-lettered %v, want the event with the encoder's reason", dlq.got)
	}
}

// TestPipelineEncoderFailureRestarts: an encoder error that is not the
// event's fault (the registry is down) ends the session with a restartable
// error, and nothing is confirmed past the event.
func TestPipelineEncoderFailureRestarts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Encoder = &fakeEncoder{err: errors.New("schema registry: connection refused")}
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	err := h.result()
	if err == nil || halt.Is(err) || errors.Is(err, replication.ErrBadValue) || !errors.Is(err, errEncode) || restartCause(err) != "format" {
		t.Fatalf("Run() = %v, want a restartable encode error (cause format)", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %s", got)
	}
}
