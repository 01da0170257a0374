package publisher

import (
	"context"
	"sync"

	"github.com/outboxd/outboxd/kafka"
)

// fakeProducer records what is sent; the test decides each record's fate.
type fakeProducer struct {
	mu      sync.Mutex
	sent    []*kafka.Record
	sentCh  chan *kafka.Record
	results chan *kafka.Record
	closed  bool
}

func newFakeProducer() *fakeProducer {
	return &fakeProducer{sentCh: make(chan *kafka.Record, 1000), results: make(chan *kafka.Record, 1000)}
}

func (f *fakeProducer) Send(ctx context.Context, r *kafka.Record) error {
	f.mu.Lock()
	f.sent = append(f.sent, r)
	f.mu.Unlock()
	f.sentCh <- r
	return nil
}

func (f *fakeProducer) Results() <-chan *kafka.Record { return f.results }

func (f *fakeProducer) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		close(f.results)
	}
	return nil
}

func (f *fakeProducer) ack(r *kafka.Record) { f.back(r) }
func (f *fakeProducer) fail(r *kafka.Record, err error) {
	r.Err = err
	f.back(r)
}

// back returns r as the producer does: to its own Done channel when it has
// one, else on Results.
func (f *fakeProducer) back(r *kafka.Record) {
	if r.Done != nil {
		r.Done <- r
		return
	}
	f.results <- r
}

// fakeTxnProducer adds Commit, counted, and Abort.
type fakeTxnProducer struct {
	*fakeProducer
	commits chan struct{}
}

func (f *fakeTxnProducer) Commit(context.Context) error {
	f.commits <- struct{}{}
	return nil
}

func (f *fakeTxnProducer) Abort(context.Context) error { return nil }

func (f *fakeProducer) numSent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

type fakeDLQ struct {
	mu  sync.Mutex
	got []*kafka.Record
	err error
}

func (d *fakeDLQ) DeadLetter(_ context.Context, r *kafka.Record, _ error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return d.err
	}
	d.got = append(d.got, r)
	return nil
}
