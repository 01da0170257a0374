package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
)

// fakeStore is an in-memory store: an outbox id is committed when the
// handler succeeded; a committed id is a duplicate afterwards. The handler
// gets a nil transaction.
type fakeStore struct {
	mu        sync.Mutex
	committed map[int64]bool
	dups      map[int64]int
	attempts  int
	batches   int     // attemptBatch calls
	dbErrs    []error // returned (as *dbError) by the next attempts, before anything else
	pingErrs  []error // returned by the next pings
	pings     int
	// onCommit, when set, is called with the offsets of every committed
	// transaction.
	onCommit func(offsets []int64)
}

func newFakeStore() *fakeStore {
	return &fakeStore{committed: map[int64]bool{}, dups: map[int64]int{}}
}

func (s *fakeStore) attempt(ctx context.Context, m *Message, h Handler) (bool, error) {
	s.mu.Lock()
	s.attempts++
	if len(s.dbErrs) > 0 {
		err := s.dbErrs[0]
		s.dbErrs = s.dbErrs[1:]
		s.mu.Unlock()
		return false, &dbError{op: "begin", err: err}
	}
	if s.committed[m.OutboxID] {
		s.dups[m.OutboxID]++
		s.commit(m)
		s.mu.Unlock()
		return true, nil
	}
	s.mu.Unlock()
	if err := callHandler(ctx, h, nil, m); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.committed[m.OutboxID] = true
	s.commit(m)
	return false, nil
}

// commit reports a committed transaction to onCommit; s.mu is held.
func (s *fakeStore) commit(ms ...*Message) {
	if s.onCommit == nil {
		return
	}
	offs := make([]int64, len(ms))
	for i, m := range ms {
		offs[i] = m.Offset
	}
	s.onCommit(offs)
}

// attemptBatch is attempt for a batch, all or nothing.
func (s *fakeStore) attemptBatch(ctx context.Context, ms []*Message, h BatchHandler) ([]bool, error) {
	s.mu.Lock()
	s.batches++
	if len(s.dbErrs) > 0 {
		err := s.dbErrs[0]
		s.dbErrs = s.dbErrs[1:]
		s.mu.Unlock()
		return nil, &dbError{op: "begin", err: err}
	}
	dup := make([]bool, len(ms))
	seen := map[int64]bool{}
	var fresh []*Message
	for i, m := range ms {
		if s.committed[m.OutboxID] || seen[m.OutboxID] {
			dup[i] = true
			continue
		}
		seen[m.OutboxID] = true
		fresh = append(fresh, m)
	}
	s.mu.Unlock()
	if len(fresh) > 0 {
		if err := callBatchHandler(ctx, h, nil, fresh); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range ms {
		if dup[i] {
			s.dups[m.OutboxID]++
		} else {
			s.committed[m.OutboxID] = true
		}
	}
	s.commit(ms...)
	return dup, nil
}

func (s *fakeStore) ping(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pings++
	if len(s.pingErrs) > 0 {
		err := s.pingErrs[0]
		s.pingErrs = s.pingErrs[1:]
		return err
	}
	return nil
}

// fakeProducer records what it is sent; err fails every send.
type fakeProducer struct {
	mu   sync.Mutex
	sent []*sarama.ProducerMessage
	err  error
}

func (p *fakeProducer) SendMessage(m *sarama.ProducerMessage) (int32, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return 0, 0, p.err
	}
	p.sent = append(p.sent, m)
	return 0, int64(len(p.sent) - 1), nil
}

// scriptHandler fails per outbox id with the errors in script, in turn,
// then succeeds; calls counts the calls per id. As a BatchHandler it
// handles the messages in turn up to the first failure, and records the
// outbox ids of each call in batches.
type scriptHandler struct {
	mu      sync.Mutex
	script  map[int64][]error
	calls   map[int64]int
	always  map[int64]error // fails every call
	panics  map[int64]bool
	batches [][]int64
}

func newScriptHandler() *scriptHandler {
	return &scriptHandler{script: map[int64][]error{}, calls: map[int64]int{}, always: map[int64]error{}, panics: map[int64]bool{}}
}

func (h *scriptHandler) Handle(_ context.Context, _ pgx.Tx, m *Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.handle(m)
}

func (h *scriptHandler) HandleBatch(_ context.Context, _ pgx.Tx, ms []*Message) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]int64, len(ms))
	for i, m := range ms {
		ids[i] = m.OutboxID
	}
	h.batches = append(h.batches, ids)
	for _, m := range ms {
		if err := h.handle(m); err != nil {
			return err
		}
	}
	return nil
}

// handle is one call for m; h.mu is held.
func (h *scriptHandler) handle(m *Message) error {
	h.calls[m.OutboxID]++
	if h.panics[m.OutboxID] {
		panic("boom")
	}
	if err, ok := h.always[m.OutboxID]; ok {
		return err
	}
	if s := h.script[m.OutboxID]; len(s) > 0 {
		h.script[m.OutboxID] = s[1:]
		return s[0]
	}
	return nil
}

// recordingSleep records the waits instead of sleeping.
type recordingSleep struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (r *recordingSleep) sleep(ctx context.Context, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits = append(r.waits, d)
	return ctx.Err()
}

// fakeSession records marks and commits, in order, in log.
type fakeSession struct {
	ctx context.Context
	mu  sync.Mutex
	log []string
}

func (s *fakeSession) add(e string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, e)
}

func (s *fakeSession) events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func (s *fakeSession) Claims() map[string][]int32 { return map[string][]int32{"t": {0}} }
func (s *fakeSession) MemberID() string           { return "member" }
func (s *fakeSession) GenerationID() int32        { return 1 }
func (s *fakeSession) MarkOffset(topic string, partition int32, offset int64, _ string) {
	s.add(fmt.Sprintf("mark %d", offset))
}
func (s *fakeSession) Commit() { s.add("commit") }
func (s *fakeSession) ResetOffset(string, int32, int64, string) {
	panic("ResetOffset: offsets only move forward")
}
func (s *fakeSession) MarkMessage(m *sarama.ConsumerMessage, md string) {
	s.MarkOffset(m.Topic, m.Partition, m.Offset+1, md)
}
func (s *fakeSession) Context() context.Context { return s.ctx }

// fakeClaim delivers the messages of its channel.
type fakeClaim struct {
	msgs chan *sarama.ConsumerMessage
}

func (c *fakeClaim) Topic() string                            { return "t" }
func (c *fakeClaim) Partition() int32                         { return 0 }
func (c *fakeClaim) InitialOffset() int64                     { return 0 }
func (c *fakeClaim) HighWaterMarkOffset() int64               { return 0 }
func (c *fakeClaim) Messages() <-chan *sarama.ConsumerMessage { return c.msgs }

// msg is a record of topic "t", partition 0, with an outbox-id header
// unless id is 0.
func msg(offset, id int64, key string) *sarama.ConsumerMessage {
	m := &sarama.ConsumerMessage{Topic: "t", Partition: 0, Offset: offset, Key: []byte(key), Value: []byte(`{"v":1}`)}
	if id != 0 {
		m.Headers = []*sarama.RecordHeader{
			{Key: []byte(HeaderOutboxID), Value: []byte(strconv.FormatInt(id, 10))},
			{Key: []byte("aggregate-id"), Value: []byte(key)},
		}
	}
	return m
}

var errFlaky = errors.New("flaky")
