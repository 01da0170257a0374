package publisher

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// fakeTxn is one committed transaction in the fake server's WAL.
type fakeTxn struct {
	end    pglogrepl.LSN
	events []replication.Message
	// gate, when set, holds the transaction after its first event until
	// closed: a stop requested then finds a transaction in hand. atGate,
	// when set, is closed once the first event was handed over and the
	// transaction waits at the gate.
	gate, atGate chan struct{}
}

// fakeServer is the Postgres side of the service tests: a WAL of committed
// transactions and one slot with a confirmed position. Every OpenSource
// starts a fakeSource at the slot's confirmed position, like the real slot.
type fakeServer struct {
	mu        sync.Mutex
	wal       []fakeTxn
	confirmed pglogrepl.LSN   // the slot's confirmed_flush_lsn
	appended  chan struct{}   // closed and replaced on every append
	opens     int             // OpenSource calls
	sessions  int             // sources opened
	starts    []pglogrepl.LSN // StartLSN of each source
	// seen is every distinct progress.Confirmed() value each session's
	// source reported to the slot, in order.
	seen [][]pglogrepl.LSN
	// onOpen, when set, decides each OpenSource call (attempt counts from
	// 0): a non-nil error is returned instead of a source. It may block.
	onOpen func(ctx context.Context, attempt int) error
	// runErr, when set, makes session n's Run fail with the returned error
	// once it has delivered the WAL it found.
	runErr func(session int) error
}

func newFakeServer(start pglogrepl.LSN) *fakeServer {
	return &fakeServer{confirmed: start, appended: make(chan struct{})}
}

// commit appends a transaction of the given events ending at end.
func (s *fakeServer) commit(end pglogrepl.LSN, evs ...replication.Message) {
	s.commitTxn(fakeTxn{end: end, events: evs})
}

func (s *fakeServer) commitTxn(t fakeTxn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wal = append(s.wal, t)
	close(s.appended)
	s.appended = make(chan struct{})
}

func (s *fakeServer) open(ctx context.Context) (Source, error) {
	s.mu.Lock()
	attempt := s.opens
	s.opens++
	onOpen := s.onOpen
	s.mu.Unlock()
	if onOpen != nil {
		if err := onOpen(ctx, attempt); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	src := &fakeSource{srv: s, session: s.sessions, start: s.confirmed}
	s.sessions++
	s.starts = append(s.starts, s.confirmed)
	s.seen = append(s.seen, nil)
	return src, nil
}

// next is the first transaction ending after pos, and a channel closed when
// the WAL grows.
func (s *fakeServer) next(pos pglogrepl.LSN) (*fakeTxn, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.wal {
		if s.wal[i].end > pos {
			return &s.wal[i], nil
		}
	}
	return nil, s.appended
}

// report is a standby status update: the slot's confirmed position moves
// forward only.
func (s *fakeServer) report(session int, lsn pglogrepl.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seen := s.seen[session]; len(seen) == 0 || seen[len(seen)-1] != lsn {
		s.seen[session] = append(seen, lsn)
	}
	if lsn > s.confirmed {
		s.confirmed = lsn
	}
}

func (s *fakeServer) slotConfirmed() pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.confirmed
}

func (s *fakeServer) startLSNs() []pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.starts)
}

func (s *fakeServer) seenBy(session int) []pglogrepl.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen[session])
}

// holder is Deps.ReadSlotHolder: the slot belongs to the walsender of the
// source opened last (BackendPID 100 + its session), as a takeover leaves
// it; 0 before any.
func (s *fakeServer) holder(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions == 0 {
		return 0, nil
	}
	return 100 + s.sessions - 1, nil
}

func (s *fakeServer) numOpens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens
}

// fakeSource is one replication session. Like replication.Stream it
// delivers whole transactions in commit order after its start position,
// stops reading at a transaction boundary when ctx is cancelled, closes out
// when it stops reading, and keeps reporting what its gate says may be
// confirmed until the gate's Done is closed.
type fakeSource struct {
	srv     *fakeServer
	session int
	start   pglogrepl.LSN
	closed  bool
}

// statusPoll is how often the fake source reports the confirmed position.
const statusPoll = time.Millisecond

func (f *fakeSource) StartLSN() pglogrepl.LSN { return f.start }

// BackendPID is the fake walsender's process id: 100 + the session number.
func (f *fakeSource) System() (string, int32, string, uint32) {
	return "7000000000000000001", 1, "outboxd", 16384
}

func (f *fakeSource) Slot() string { return "outboxd" }

func (f *fakeSource) BackendPID() int { return 100 + f.session }

func (f *fakeSource) Close() { f.closed = true }

var errFakeStopped = errors.New("fake source: stopped")

func (f *fakeSource) Run(ctx context.Context, out chan<- replication.Message, progress replication.Gate, _ replication.Budget) error {
	err := f.receive(ctx, out, progress)
	close(out)
	if errors.Is(err, errFakeStopped) {
		err = nil
	}
	if err != nil {
		return err
	}
	// Drain: the consumer finishes what it has; keep the server informed.
	tick := time.NewTicker(statusPoll)
	defer tick.Stop()
	for {
		select {
		case <-progress.Done():
			f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
			return nil
		case <-tick.C:
			f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
		}
	}
}

func (f *fakeSource) receive(ctx context.Context, out chan<- replication.Message, progress replication.Gate) error {
	tick := time.NewTicker(statusPoll)
	defer tick.Stop()
	pos := f.start
	f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
	for {
		// A stop takes effect between transactions only.
		if ctx.Err() != nil {
			return nil
		}
		t, grew := f.srv.next(pos)
		if t == nil {
			if f.srv.runErr != nil {
				if err := f.srv.runErr(f.session); err != nil {
					return err
				}
			}
			select {
			case <-grew:
			case <-ctx.Done():
			case <-progress.Done():
				return nil
			case <-tick.C:
				f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
			}
			continue
		}
		// Begin: the stop request is honoured before a new transaction.
		if err := f.deliver(ctx.Done(), out, progress, replication.Message{Kind: replication.KindBegin, Begin: replication.Begin{CommitTime: time.Now()}}); err != nil {
			return err
		}
		for i, ev := range t.events {
			if err := f.deliver(nil, out, progress, ev); err != nil {
				return err
			}
			if i == 0 && t.gate != nil {
				if t.atGate != nil {
					close(t.atGate)
				}
				select {
				case <-t.gate:
				case <-progress.Done():
					return errFakeStopped
				}
			}
		}
		if err := f.deliver(nil, out, progress, replication.Message{Kind: replication.KindCommit, Commit: replication.Commit{EndLSN: t.end}}); err != nil {
			return err
		}
		pos = t.end
		f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
	}
}

// deliver hands m to the consumer; stop (nil inside a transaction) abandons
// it, as does the consumer going away.
func (f *fakeSource) deliver(stop <-chan struct{}, out chan<- replication.Message, progress replication.Gate, m replication.Message) error {
	tick := time.NewTicker(statusPoll)
	defer tick.Stop()
	for {
		select {
		case out <- m:
			return nil
		case <-stop:
			return errFakeStopped
		case <-progress.Done():
			return errFakeStopped
		case <-tick.C:
			f.srv.report(f.session, progress.Confirmable(progress.Confirmed()))
		}
	}
}

// fate is what the fake Kafka does with a record.
type fate int

const (
	ack    fate = iota // acknowledge at once
	fail               // fail at once with the policy's error
	hold               // never answer (failed with kafka.ErrProducerClosed on Close)
	manual             // hand to the test on svcKafka.manual
)

// svcKafka hands out a svcProducer per session and logs every record sent.
type svcKafka struct {
	mu       sync.Mutex
	sessions int
	sent     []int64 // outbox ids in send order, across sessions
	// policy decides each record's fate; nil acknowledges everything.
	policy func(session int, r *kafka.Record) (fate, error)
	manual chan sentRecord
}

type sentRecord struct {
	session int
	r       *kafka.Record
	p       *svcProducer
}

func newSvcKafka(policy func(session int, r *kafka.Record) (fate, error)) *svcKafka {
	return &svcKafka{policy: policy, manual: make(chan sentRecord, 1000)}
}

func (k *svcKafka) newProducer(Identity) (outbox.Producer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := &svcProducer{k: k, session: k.sessions, results: make(chan *kafka.Record, 1000), held: map[*kafka.Record]bool{}}
	k.sessions++
	return p, nil
}

func (k *svcKafka) sentIDs() []int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.sent)
}

type svcProducer struct {
	k       *svcKafka
	session int
	mu      sync.Mutex
	results chan *kafka.Record
	held    map[*kafka.Record]bool
	closed  bool
}

func (p *svcProducer) Send(ctx context.Context, r *kafka.Record) error {
	p.k.mu.Lock()
	p.k.sent = append(p.k.sent, r.OutboxID)
	policy := p.k.policy
	p.k.mu.Unlock()
	f, err := ack, error(nil)
	if policy != nil {
		f, err = policy(p.session, r)
	}
	switch f {
	case ack, fail:
		p.resolve(r, err, false)
	case hold:
		p.mu.Lock()
		p.held[r] = true
		p.mu.Unlock()
	case manual:
		p.mu.Lock()
		p.held[r] = true
		p.mu.Unlock()
		p.k.manual <- sentRecord{session: p.session, r: r, p: p}
	}
	return nil
}

// resolve returns r on Results with err; held says r must still be held
// (a manual answer after Close is dropped: Close answered it).
func (p *svcProducer) resolve(r *kafka.Record, err error, held bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || (held && !p.held[r]) {
		return
	}
	delete(p.held, r)
	r.Err = err
	p.results <- r
}

func (p *svcProducer) ack(r *kafka.Record)             { p.resolve(r, nil, true) }
func (p *svcProducer) fail(r *kafka.Record, err error) { p.resolve(r, err, true) }

func (p *svcProducer) Results() <-chan *kafka.Record { return p.results }

func (p *svcProducer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for r := range p.held {
		r.Err = kafka.ErrProducerClosed
		p.results <- r
	}
	p.held = nil
	close(p.results)
	return nil
}
