package kafka

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A dead letter keeps the record's key, value and headers and adds the
// dlq-* headers.
func TestDeadLetterKeepsTheRecordAndAddsHeaders(t *testing.T) {
	f := startFakeKafka(t, 1, "dlq")
	d, err := NewDeadLetterer(testKafkaConfig(f.c.ListenAddrs()), "dlq")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	r := rec(7, "orders", "k")
	if err := d.DeadLetter(context.Background(), r, errors.New("refused")); err != nil {
		t.Fatal(err)
	}
	cl := newKgoClient(t, f.c.ListenAddrs())
	cl.AddConsumeTopics("dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got *kgo.Record
	for got == nil && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(kr *kgo.Record) { got = kr })
	}
	if got == nil {
		t.Fatal("no dead letter read within 10 s")
	}
	headers := map[string]string{}
	for _, h := range got.Headers {
		headers[h.Key] = string(h.Value)
	}
	if string(got.Key) != "k" || string(got.Value) != "7" || headers["outbox-id"] != "7" ||
		headers[HeaderDLQError] != "refused" || headers[HeaderDLQSourceTopic] != "orders" || headers[HeaderDLQErrorClass] != ClassPoison {
		t.Fatalf("dead letter key %q value %q headers %v: want the record's own and the dlq-* headers", got.Key, got.Value, headers)
	}
}

// DeadLetter returns when its context ends, and Close at once after it,
// though the broker never answers: shutdown does not wait out retries.
// With sarama's SyncProducer both waited for its read timeout and retries.
func TestDeadLetterEndsWhenItsContextIsCancelled(t *testing.T) {
	f := startFakeKafka(t, 1, "dlq")
	var held atomic.Int32
	f.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		held.Add(1)
		return nil, nil, true // no answer
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.RequestTimeout = 30 * time.Second // a read timeout far past the test's bounds
	cfg.DeliveryTimeout = time.Minute
	d, err := NewDeadLetterer(cfg, "dlq")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.DeadLetter(ctx, rec(1, "orders", "k"), errors.New("refused")) }()
	waitFor(t, func() bool { return held.Load() > 0 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("DeadLetter: %v, want the context's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("DeadLetter still running 5 s after its context was cancelled")
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close still waiting 5 s after the cancel, for a request never answered")
	}
}
