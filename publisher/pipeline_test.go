package publisher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

func begin() replication.Message {
	return replication.Message{Kind: replication.KindBegin, Begin: replication.Begin{CommitTime: time.Unix(1700000000, 0)}}
}

func event(id int64, agg, topic string) replication.Message {
	return replication.Message{Kind: replication.KindEvent, Event: replication.Event{
		ID: id, AggregateID: agg, Topic: topic, Payload: []byte(`{"n":1}`),
		CreatedAt: time.Unix(1700000000, 123000).UTC(),
	}}
}

func commit(end pglogrepl.LSN) replication.Message {
	return replication.Message{Kind: replication.KindCommit, Commit: replication.Commit{EndLSN: end}}
}

type harness struct {
	t    *testing.T
	hook outbox.Hook
	prod *fakeProducer
	p    *Pipeline
	in   chan replication.Message
	err  chan error
}

func startPipeline(t *testing.T, cfg Config, dlq outbox.DeadLetterer) *harness {
	return startPipelineWithHook(t, cfg, dlq, nil)
}

func startPipelineWithHook(t *testing.T, cfg Config, dlq outbox.DeadLetterer, hook outbox.Hook) *harness {
	t.Helper()
	h := &harness{t: t, hook: hook, prod: newFakeProducer(), in: make(chan replication.Message, 100), err: make(chan error, 1)}
	var d outbox.DeadLetterer
	if dlq != nil {
		d = dlq
	}
	h.p = NewPipeline(cfg, zap.NewNop(), h.prod, d, h.hook, 1000, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { h.err <- h.p.Run(ctx, h.in) }()
	return h
}

func (h *harness) next() *kafka.Record {
	h.t.Helper()
	select {
	case r := <-h.prod.sentCh:
		return r
	case <-time.After(5 * time.Second):
		h.t.Fatal("no record sent")
		return nil
	}
}

func (h *harness) waitConfirmed(want pglogrepl.LSN) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for h.p.Confirmed() != want {
		if time.Now().After(deadline) {
			h.t.Fatalf("Confirmed() = %d, want %d", h.p.Confirmed(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) result() error {
	h.t.Helper()
	select {
	case err := <-h.err:
		return err
	case <-time.After(5 * time.Second):
		h.t.Fatal("pipeline did not return")
		return nil
	}
}

func TestPipelineConfirmsOnlyAfterEveryEventIsAcked(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- event(2, "b", "t")
	h.in <- commit(2000)
	r1, r2 := h.next(), h.next()
	h.prod.ack(r2)
	time.Sleep(20 * time.Millisecond)
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %d with one event unacked", got)
	}
	h.prod.ack(r1)
	h.waitConfirmed(2000)
	close(h.in)
	if err := h.result(); err != nil {
		t.Fatalf("Run() = %v after a clean drain", err)
	}
}

func TestPipelineMapsEventToRecord(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	m := event(42, "order-7", "orders")
	m.Event.EventType = "order.created"
	h.in <- begin()
	h.in <- m
	h.in <- commit(2000)
	r := h.next()
	if r.Topic != "orders" || string(r.Key) != "order-7" || string(r.Value) != `{"n":1}` {
		t.Fatalf("record %q %q %q", r.Topic, r.Key, r.Value)
	}
	want := map[string]string{outbox.HeaderOutboxID: "42", outbox.HeaderAggregateID: "order-7", outbox.HeaderEventType: "order.created"}
	if len(r.Headers) != len(want) {
		t.Fatalf("headers %v", r.Headers)
	}
	for _, hd := range r.Headers {
		if want[hd.Key] != string(hd.Value) {
			t.Errorf("header %s = %q, want %q", hd.Key, hd.Value, want[hd.Key])
		}
	}
	if !r.Timestamp.Equal(m.Event.CreatedAt) {
		t.Errorf("timestamp %v, want created_at %v", r.Timestamp, m.Event.CreatedAt)
	}
}

func TestPipelineUsesDefaultTopicForRowsWithoutTopic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DefaultTopic = "fallback"
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	h.in <- event(1, "a", "")
	h.in <- commit(2000)
	if r := h.next(); r.Topic != "fallback" {
		t.Fatalf("topic %q, want fallback", r.Topic)
	}
}

func TestPipelineProduceErrorStopsWithoutConfirming(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- event(2, "a", "t")
	h.in <- commit(2000)
	r1, r2 := h.next(), h.next()
	h.prod.fail(r1, &kafka.ProduceError{OutboxID: 1, Topic: "t", Err: sarama.ErrNotEnoughReplicas})
	h.prod.ack(r2)
	err := h.result()
	if !errors.Is(err, kafka.ErrProduce) || !errors.Is(err, sarama.ErrNotEnoughReplicas) {
		t.Fatalf("Run() = %v, want kafka.ErrProduce wrapping the cause", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %d past a failed event", got)
	}
	<-h.p.Done()
}

func TestPipelinePoisonHaltsWithClearErrorWithoutDeadLetterTopic(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- event(7, "a", "t")
	h.in <- commit(2000)
	r := h.next()
	h.prod.fail(r, poison(r, sarama.ErrMessageSizeTooLarge))
	err := h.result()
	if !errors.Is(err, kafka.ErrPoison) {
		t.Fatalf("Run() = %v, want kafka.ErrPoison", err)
	}
	want := `poison event: outbox id 7 to topic "t" (31 bytes) refused: kafka server: Message was too large, server rejected it to avoid allocation error; nothing was confirmed past it: fix the cause (topic, size limits) or set --dead-letter-topic, then restart`
	if err.Error() != want {
		t.Fatalf("error text\n got: %s\nwant: %s", err, want)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %d past a poison event", got)
	}
}

func TestPipelinePoisonGoesToDeadLetterTopicAndConfirms(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeadLetterTopic = "dlq"
	dlq := &fakeDLQ{}
	h := startPipeline(t, cfg, dlq)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- event(2, "a", "t")
	h.in <- commit(2000)
	r1, r2 := h.next(), h.next()
	h.prod.fail(r1, poison(r1, sarama.ErrUnknownTopicOrPartition))
	h.prod.ack(r2)
	h.waitConfirmed(2000)
	if len(dlq.got) != 1 || dlq.got[0].OutboxID != 1 {
		t.Fatalf("dead-lettered %v, want outbox id 1", dlq.got)
	}
}

func TestPipelineDeadLetterFailureStopsWithoutConfirming(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DeadLetterTopic = "dlq"
	h := startPipeline(t, cfg, &fakeDLQ{err: errors.New("broker down")})
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	r := h.next()
	h.prod.fail(r, poison(r, sarama.ErrUnknownTopicOrPartition))
	if err := h.result(); err == nil || !strings.Contains(err.Error(), "dead-letter") {
		t.Fatalf("Run() = %v, want a dead-letter error", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %d past an event not in the dead-letter topic", got)
	}
}

func TestPipelineUnroutableEventIsPoison(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	h.in <- event(9, "a", "")
	err := h.result()
	if !errors.Is(err, replication.ErrBadValue) || !strings.Contains(err.Error(), "id 9") || !strings.Contains(err.Error(), "no topic") ||
		!strings.Contains(err.Error(), "--skip-bad-event") {
		t.Fatalf("Run() = %v, want a bad-event error naming id 9, the missing topic and how to skip it", err)
	}
}

func TestPipelineBoundsEventsInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlightEvents = 3
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	for i := int64(1); i <= 10; i++ {
		h.in <- event(i, "a", "t")
	}
	first := []*kafka.Record{h.next(), h.next(), h.next()}
	time.Sleep(50 * time.Millisecond)
	if n := h.prod.numSent(); n != 3 {
		t.Fatalf("%d records in flight, want at most 3", n)
	}
	h.prod.ack(first[0])
	h.next() // one slot freed, one more sent
	time.Sleep(20 * time.Millisecond)
	if n := h.prod.numSent(); n != 4 {
		t.Fatalf("%d records sent after one ack, want 4", n)
	}
}

func TestPipelineBoundsBytesInFlight(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlightBytes = 2*(31+replication.EventOverhead) + 100 // each test record costs 31 bytes + the overhead: two fit
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	for i := int64(1); i <= 5; i++ {
		h.in <- event(i, "a", "t")
	}
	h.next()
	h.next()
	time.Sleep(50 * time.Millisecond)
	if n := h.prod.numSent(); n != 2 {
		t.Fatalf("%d records in flight, want 2 under the byte bound", n)
	}
}

func TestPipelineKeepsPerKeySendOrder(t *testing.T) {
	h := startPipeline(t, DefaultConfig(), nil)
	h.in <- begin()
	for i := int64(1); i <= 50; i++ {
		h.in <- event(i, "k", "t")
	}
	h.in <- commit(2000)
	for i := int64(1); i <= 50; i++ {
		if r := h.next(); r.OutboxID != i {
			t.Fatalf("sent outbox id %d at position %d", r.OutboxID, i)
		}
	}
}

type fakeHook struct {
	err error
	ran []int64
}

func (f *fakeHook) AfterPublish(_ context.Context, r *kafka.Record) error {
	f.ran = append(f.ran, r.OutboxID)
	return f.err
}

func TestPipelineHookRunsAfterAckBeforeConfirm(t *testing.T) {
	hook := &fakeHook{}
	h := startPipelineWithHook(t, DefaultConfig(), nil, hook)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	h.prod.ack(h.next())
	h.waitConfirmed(2000)
	if len(hook.ran) != 1 || hook.ran[0] != 1 {
		t.Fatalf("hook ran for %v, want [1]", hook.ran)
	}
}

func TestPipelineHookFailureStopsWithoutConfirming(t *testing.T) {
	h := startPipelineWithHook(t, DefaultConfig(), nil, &fakeHook{err: fmt.Errorf("%w: boom", outbox.ErrHook)})
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	h.prod.ack(h.next())
	if err := h.result(); !errors.Is(err, outbox.ErrHook) {
		t.Fatalf("Run() = %v, want outbox.ErrHook", err)
	}
	if got := h.p.Confirmed(); got != 1000 {
		t.Fatalf("confirmed %d although the hook failed", got)
	}
}

func TestPipelineHookDoesNotRunWhenPublishFails(t *testing.T) {
	hook := &fakeHook{}
	h := startPipelineWithHook(t, DefaultConfig(), nil, hook)
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- commit(2000)
	r := h.next()
	h.prod.fail(r, &kafka.ProduceError{OutboxID: 1, Topic: "t", Err: sarama.ErrNotEnoughReplicas})
	if err := h.result(); !errors.Is(err, kafka.ErrProduce) {
		t.Fatalf("Run() = %v", err)
	}
	if len(hook.ran) != 0 {
		t.Fatalf("hook ran for a failed publish")
	}
}

func TestParseHooks(t *testing.T) {
	got, err := outbox.ParseHooks([]string{"orders=UPDATE orders SET s = 1 WHERE id = $2", " t2 = SELECT 1 "})
	if err != nil || got["orders"] != "UPDATE orders SET s = 1 WHERE id = $2" || got["t2"] != "SELECT 1" {
		t.Fatalf("ParseHooks = %v, %v", got, err)
	}
	for _, bad := range [][]string{{"noequals"}, {"=SELECT 1"}, {"t="}, {"t=SELECT 1", "t=SELECT 2"}} {
		if _, err := outbox.ParseHooks(bad); err == nil {
			t.Errorf("ParseHooks(%q) accepted", bad)
		}
	}
}

// The wedge: with the in-flight limit reached, the reader waits in
// the limiter; a failed record must release it, not leave it waiting for
// acknowledgements that will never come.
func TestPipelineFailureReleasesReaderBlockedOnInFlightLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlightEvents = 2
	h := startPipeline(t, cfg, nil)
	h.in <- begin()
	for i := int64(1); i <= 5; i++ {
		h.in <- event(i, "a", "t")
	}
	r1 := h.next()
	h.next()
	h.prod.fail(r1, &kafka.ProduceError{OutboxID: 1, Topic: "t", Err: sarama.ErrNotEnoughReplicas})
	err := h.result()
	if !errors.Is(err, kafka.ErrProduce) {
		t.Fatalf("Run() = %v, want the produce error", err)
	}
	if n := h.prod.numSent(); n != 2 {
		t.Fatalf("%d records sent after the failure, want 2", n)
	}
}

// blockingProducer's Send blocks like a full producer input until its
// context ends.
type blockingProducer struct {
	*fakeProducer
	entered chan struct{}
}

func (b *blockingProducer) Send(ctx context.Context, r *kafka.Record) error {
	if b.numSent() < 1 {
		return b.fakeProducer.Send(ctx, r)
	}
	close(b.entered)
	<-ctx.Done()
	return ctx.Err()
}

func TestPipelineFailureReleasesSendBlockedOnProducerInput(t *testing.T) {
	prod := &blockingProducer{fakeProducer: newFakeProducer(), entered: make(chan struct{})}
	p := NewPipeline(DefaultConfig(), zap.NewNop(), prod, nil, nil, 1000, nil)
	in := make(chan replication.Message, 10)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background(), in) }()
	in <- begin()
	in <- event(1, "a", "t")
	in <- event(2, "a", "t")
	in <- commit(2000)
	r1 := <-prod.sentCh
	<-prod.entered
	prod.fail(r1, &kafka.ProduceError{OutboxID: 1, Topic: "t", Err: sarama.ErrNotEnoughReplicas})
	select {
	case err := <-errc:
		if !errors.Is(err, kafka.ErrProduce) {
			t.Fatalf("Run() = %v, want the produce error, not the cancellation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still blocked in Send after a record failed")
	}
}

func TestPipelineHookFailureReleasesReaderBlockedOnInFlightLimit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxInFlightEvents = 1
	h := startPipelineWithHook(t, cfg, nil, &fakeHook{err: fmt.Errorf("%w: boom", outbox.ErrHook)})
	h.in <- begin()
	h.in <- event(1, "a", "t")
	h.in <- event(2, "a", "t")
	h.prod.ack(h.next())
	if err := h.result(); !errors.Is(err, outbox.ErrHook) {
		t.Fatalf("Run() = %v, want the hook error", err)
	}
}
