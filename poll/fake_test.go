package poll

import (
	"context"
	"sync"
	"time"

	"github.com/outboxd/outboxd/kafka"
)

// fakeProducer acknowledges after delay, or fails records as fail decides.
type fakeProducer struct {
	delay   time.Duration
	fail    func(r *kafka.Record) error // nil: acknowledge
	results chan *kafka.Record
	wg      sync.WaitGroup
	once    sync.Once

	mu   sync.Mutex
	sent []*kafka.Record
}

func newFakeProducer(delay time.Duration, fail func(*kafka.Record) error) *fakeProducer {
	return &fakeProducer{delay: delay, fail: fail, results: make(chan *kafka.Record, 100000)}
}

func (f *fakeProducer) Send(ctx context.Context, r *kafka.Record) error {
	f.mu.Lock()
	f.sent = append(f.sent, r)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		time.Sleep(f.delay)
		if f.fail != nil {
			r.Err = f.fail(r)
		}
		if r.Done != nil {
			r.Done <- r
			return
		}
		f.results <- r
	}()
	return nil
}

func (f *fakeProducer) Results() <-chan *kafka.Record { return f.results }

func (f *fakeProducer) Close() error {
	f.once.Do(func() {
		go func() {
			f.wg.Wait()
			close(f.results)
		}()
	})
	return nil
}

func (f *fakeProducer) ids() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]int64, len(f.sent))
	for i, r := range f.sent {
		ids[i] = r.OutboxID
	}
	return ids
}

// fakeDLQ records what it was given.
type fakeDLQ struct {
	mu  sync.Mutex
	got []int64
}

func (d *fakeDLQ) DeadLetter(_ context.Context, r *kafka.Record, _ error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, r.OutboxID)
	return nil
}

func (d *fakeDLQ) ids() []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int64(nil), d.got...)
}
