package kafka

import (
	"context"
	"errors"
	"fmt"
	"github.com/outboxd/outboxd/backoff"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// Producer is outboxd's Kafka producer: Kafka's idempotent producer
// protocol, spoken through sarama's client and broker API, with one rule
// sarama's AsyncProducer cannot keep — nothing later in a partition is ever
// appended after a record of that partition failed.
//
// # Why not sarama's AsyncProducer
//
// With the AsyncProducer a record can fail while a later record of the same
// partition succeeds, and the pipeline's restart then appends the failed
// record after the later one: a consumer sees an aggregate's events out of
// commit order (issue 15). sarama fails a record without failing those behind
// it in three ways: its retries run out (Producer.Retry.Max) while later
// records, with fewer retries used, are still retrying; a leader lookup fails
// during a leader election or while the broker is down
// (partitionProducer.updateLeaderIfBrokerProducerIsNil returns that one
// record as failed, then tries the next); and after either, the idempotent
// producer bumps its epoch (asyncProducer.returnErrors), which resets the
// sequence numbers, so the broker accepts the later records instead of
// rejecting them as out of sequence.
//
// # The rules kept here
//
//  1. Each partition has at most one batch in flight; the next batch is
//     built only after the previous one was acknowledged.
//  2. A batch that fails with a retriable error (not leader, no leader yet,
//     not enough replicas, request timed out, a broken connection) is sent
//     again unchanged — same producer id, epoch and first sequence — until it
//     succeeds. The broker keeps the last five batches of each producer and
//     partition and acknowledges a batch it already appended without
//     appending it twice (KIP-98), so a retry after a lost response adds no
//     duplicate. The epoch is never bumped.
//  3. A batch that can never succeed (fenced, out of sequence, unknown
//     producer, not authorised), or that kept failing for DeliveryTimeout,
//     fails together with every record queued behind it in its partition,
//     none of which is sent; so is every later record of that partition
//     until the producer is closed. The pipeline restarts from the last
//     confirmed position and sends them again, in order.
//  4. A poison record (too large, unknown topic, invalid) is refused alone
//     when ContinueAfterPoison is set (the pipeline diverts it to the
//     dead-letter topic); otherwise it stops its partition like rule 3, as the
//     pipeline halts on it.
//
// A record comes back on Results exactly once, acknowledged or failed; the
// acknowledged records of one partition come back in the order they were
// sent.
type Producer struct {
	cfg     Config
	conf    *sarama.Config
	client  sarama.Client
	log     *zap.Logger
	hooks   ProducerHooks
	pid     int64
	epoch   int16
	version int16 // produce request version

	in chan *Record
	// inBatch carries SendBatch's records. Records of one partition must
	// come through one channel to keep their order: the pipeline sends all
	// its records with SendBatch (Send is for others, e.g. checkpoints).
	inBatch chan []*Record
	resp    chan produceResponse
	meta    chan topicMeta
	closing chan struct{}
	closeMu sync.Once
	stopped chan struct{} // closed when run returns
	results chan *Record

	txnCtl chan *txnRequest
	added  chan addResult
	ended  chan error

	// Owned by the run goroutine.
	txn         txnState
	outstanding int // records accepted and not yet back
	topics      map[string]*topicState
	brokers     map[int32]*brokerState
	inflight    int // requests in flight
	now         func() time.Time
}

// ProducerHooks observe the producer; any may be nil. They are called from
// the producer's own goroutine and must not block.
type ProducerHooks struct {
	// OnRetry is called when a batch failed with a retriable error and will
	// be sent again.
	OnRetry func(topic string, partition int32, attempt int, err error)
	// OnRecovered is called when a partition that had failed produces again,
	// with the time from its first failure to the acknowledgement.
	OnRecovered func(topic string, partition int32, stalled time.Duration)
}

// ErrProducerClosed fails the records still queued when the producer closes.
var ErrProducerClosed = errors.New("kafka producer closed")

// errPartitionStopped fails records queued behind a record that failed for
// good; they were never sent.
var errPartitionStopped = errors.New("not sent: an earlier record of the same partition failed")

type topicState struct {
	name       string
	partitions int32 // 0 until metadata is known
	parts      map[int32]*partitionState
	pending    []*Record // waiting for the partition count
	resolving  bool
	resolveAt  time.Time // earliest next metadata refresh
	failingAt  time.Time // first failed refresh of the current run of failures
	attempts   int
	failed     error // every record of the topic fails with it
}

type partitionState struct {
	topic     *topicState
	partition int32
	leader    *sarama.Broker // nil: unknown, resolve the topic
	queue     []*Record      // not yet in a batch, in order
	queued    int            // bytes in queue
	batch     *batch         // in flight, or waiting to be sent again
	seq       int32          // first sequence of the next new batch
	single    int            // send this many next records one per batch
	retryAt   time.Time
	failingAt time.Time // first failure of the current batch
	attempts  int
	failed    error
}

type batch struct {
	bytes    int // the records' size in the batch, at most MaxMessageBytes
	recs     []*Record
	rb       *sarama.RecordBatch
	inFlight bool
}

type brokerState struct {
	b    *sarama.Broker
	busy bool
}

type produceResponse struct {
	broker *sarama.Broker
	parts  []*partitionState
	resp   *sarama.ProduceResponse
	err    error
}

type topicMeta struct {
	topic      string
	partitions int32
	leaders    map[int32]*sarama.Broker
	err        error
}

// NewProducer connects to the brokers and obtains a producer id. log
// may be nil.
func NewProducer(cfg Config, log *zap.Logger, hooks ProducerHooks) (*Producer, error) {
	conf, err := cfg.Sarama()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	client, err := sarama.NewClient(cfg.Brokers, conf)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	fitBroker(&cfg, client, conf, log)
	p := &Producer{
		cfg:     cfg,
		conf:    conf,
		client:  client,
		log:     log,
		hooks:   hooks,
		version: produceVersion(conf.Version),
		txnCtl:  make(chan *txnRequest),
		added:   make(chan addResult),
		ended:   make(chan error),
		txn:     txnState{added: map[topicPartition]bool{}},
		in:      make(chan *Record, 256),
		inBatch: make(chan []*Record, 64),
		resp:    make(chan produceResponse, 64),
		meta:    make(chan topicMeta),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		results: make(chan *Record, 4096),
		topics:  make(map[string]*topicState),
		brokers: make(map[int32]*brokerState),
		now:     time.Now,
	}
	if cfg.TransactionalID != "" {
		err = p.initTransactional()
	} else {
		var resp *sarama.InitProducerIDResponse
		if resp, err = client.InitProducerID(); err == nil && !errors.Is(resp.Err, sarama.ErrNoError) {
			err = resp.Err
		}
		if err == nil {
			p.pid, p.epoch = resp.ProducerID, resp.ProducerEpoch
		}
	}
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka producer: init producer id: %w", err)
	}
	go p.run()
	return p, nil
}

func produceVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V3_7_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 9
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 8
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	default:
		return 3
	}
}

// Send implements Producer. It blocks while the producer's input is full.
func (p *Producer) Send(ctx context.Context, r *Record) error {
	return enqueue(ctx, p.in, r, p.closing)
}

// SendBatch enqueues rs, in order, at once: the producer takes them all
// before it builds its next requests, so records sent together share
// requests (one per broker) instead of the first going alone. rs is the
// producer's from now on. It blocks while the producer's input is full.
// Records sent with SendBatch and with Send may be taken in either order:
// send a partition's records through one of them only.
func (p *Producer) SendBatch(ctx context.Context, rs []*Record) error {
	return enqueue(ctx, p.inBatch, rs, p.closing)
}

// enqueue hands v to the run loop through in, waiting while in is full
// until ctx ends or the producer closes. Closed first: with room in in, a
// select alone could take v after Close, and after run's last drain nothing
// would ever answer for it.
func enqueue[T any](ctx context.Context, in chan<- T, v T, closing <-chan struct{}) error {
	select {
	case <-closing:
		return ErrProducerClosed
	default:
	}
	select {
	case in <- v:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closing:
		return ErrProducerClosed
	}
}

// Results implements Producer.
func (p *Producer) Results() <-chan *Record { return p.results }

// Close implements Producer. Records not yet sent fail with
// ErrProducerClosed; requests in flight are abandoned (their connections
// closed) and their records fail too: they were not confirmed, so the
// pipeline's restart sends them again. Results is closed once every record
// came back.
func (p *Producer) Close() error {
	p.closeMu.Do(func() { close(p.closing) })
	return nil
}

// run owns the producer's state: it routes records to partitions, builds
// one request per idle broker, and handles responses and metadata. Kafka I/O
// runs in short-lived goroutines that report back on resp and meta.
func (p *Producer) run() {
	defer func() {
		close(p.stopped)
		close(p.results)
		p.client.Close()
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	closing := p.closing
	for {
		if closing == nil {
			if p.inflight == 0 && !p.txn.endBusy {
				return // metadata refreshes still running give up on stopped
			}
		} else {
			wake := p.schedule()
			resetTimer(timer, wake, p.now())
		}
		select {
		case r := <-p.in:
			p.add(r)
		case rs := <-p.inBatch:
			for _, r := range rs {
				p.add(r)
			}
		case pr := <-p.resp:
			p.inflight--
			p.handleResponse(pr)
		case m := <-p.meta:
			p.handleMeta(m)
		case req := <-p.txnCtl:
			p.txn.ending = req
		case r := <-p.added:
			p.handleAdded(r)
		case err := <-p.ended:
			p.handleEnded(err)
		case <-timer.C:
		case <-closing:
			closing = nil
			p.shutdown()
		}
		p.maybeEndTxn()
	}
}

func resetTimer(t *time.Timer, wake, now time.Time) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	if wake.IsZero() {
		t.Reset(time.Hour)
		return
	}
	t.Reset(max(wake.Sub(now), 0))
}

// shutdown fails everything not in flight and aborts the requests in flight.
func (p *Producer) shutdown() {
	if req := p.txn.ending; req != nil && !p.txn.endBusy {
		p.txn.ending = nil
		req.done <- ErrProducerClosed
	}
	for _, t := range p.topics {
		for _, r := range t.pending {
			p.fail(r, p.closedErr(r))
		}
		t.pending = nil
		for _, ps := range t.parts {
			if ps.batch != nil && !ps.batch.inFlight {
				for _, r := range ps.batch.recs {
					p.fail(r, p.closedErr(r))
				}
				ps.batch = nil
			}
			for _, r := range ps.queue {
				p.fail(r, p.closedErr(r))
			}
			ps.queue = nil
			ps.failed = ErrProducerClosed
		}
	}
	for _, bs := range p.brokers {
		if bs.busy {
			go bs.b.Close() // the request in flight returns with an error
		}
	}
	// Drain records a Send or SendBatch raced in before it saw closing.
	for {
		select {
		case r := <-p.in:
			p.fail(r, p.closedErr(r))
		case rs := <-p.inBatch:
			for _, r := range rs {
				p.fail(r, p.closedErr(r))
			}
		default:
			return
		}
	}
}

func (p *Producer) closedErr(r *Record) error {
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: ErrProducerClosed}
}

func (p *Producer) emit(r *Record) {
	p.outstanding--
	if r.Done != nil {
		r.Done <- r
		return
	}
	p.results <- r
}

func (p *Producer) fail(r *Record, err error) {
	r.Err = err
	p.emit(r)
}

// add routes a new record.
func (p *Producer) add(r *Record) {
	p.outstanding++
	if p.closingNow() {
		p.fail(r, p.closedErr(r))
		return
	}
	if p.txn.failed != nil {
		p.fail(r, &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: fmt.Errorf("%w: %w", ErrTxnFailed, p.txn.failed)})
		return
	}
	t := p.topics[r.Topic]
	if t == nil {
		t = &topicState{name: r.Topic, parts: make(map[int32]*partitionState)}
		p.topics[r.Topic] = t
	}
	switch {
	case t.failed != nil:
		p.fail(r, p.stoppedErr(r, t.failed))
	case t.partitions == 0:
		t.pending = append(t.pending, r)
		p.resolve(t)
	default:
		p.route(t, r)
	}
}

func (p *Producer) closingNow() bool {
	select {
	case <-p.closing:
		return true
	default:
		return false
	}
}

// recordErr is the error of r, sent in a batch that failed for cause.
func (p *Producer) recordErr(r *Record, cause error) error {
	if pe := (*PoisonError)(nil); errors.As(cause, &pe) && pe.OutboxID == r.OutboxID && pe.Topic == r.Topic {
		return cause
	}
	if errors.Is(cause, ErrProducerClosed) {
		return p.closedErr(r)
	}
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: cause}
}

// stoppedErr is the error of r, never sent because its partition stopped.
func (p *Producer) stoppedErr(r *Record, cause error) error {
	if errors.Is(cause, ErrProducerClosed) {
		return p.closedErr(r)
	}
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: errPartitionStopped}
}

func (p *Producer) route(t *topicState, r *Record) {
	part := int32(murmur2(r.Key)&0x7fffffff) % t.partitions
	ps := t.parts[part]
	if ps == nil {
		ps = &partitionState{topic: t, partition: part}
		t.parts[part] = ps
	}
	r.Partition = part
	if ps.failed != nil {
		p.fail(r, p.stoppedErr(r, ps.failed))
		return
	}
	if r.Size()+recordOverhead > p.cfg.MaxMessageBytes {
		err := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: sarama.ConfigurationError(fmt.Sprintf(
			"record of %d bytes is larger than the producer's max message bytes (%d)", r.Size(), p.cfg.MaxMessageBytes))}
		p.fail(r, err)
		if !p.cfg.ContinueAfterPoison {
			// What is queued ahead of it still goes; nothing behind it.
			ps.failed = err
		}
		return
	}
	r.enqueued = p.now()
	ps.queue = append(ps.queue, r)
	ps.queued += r.Size() + recordOverhead
	if ps.leader == nil {
		p.resolve(t)
	}
}

// poison refuses r for good: alone when the pipeline continues after poison,
// otherwise together with everything behind it in its partition.
func (p *Producer) poison(ps *partitionState, r *Record, cause error) {
	err := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: cause}
	if p.cfg.ContinueAfterPoison {
		p.fail(r, err)
		return
	}
	p.fail(r, err)
	p.stopPartition(ps, err)
}

// stopPartition fails the partition's batch and queue; every later record of
// the partition fails at once. (A partition whose failed is set with a
// queue still sends that queue: see route.)
func (p *Producer) stopPartition(ps *partitionState, cause error) {
	if ps.failed == nil {
		ps.failed = cause
	}
	if ps.batch != nil {
		for _, r := range ps.batch.recs {
			p.fail(r, p.recordErr(r, cause))
		}
		ps.batch = nil
	}
	for _, r := range ps.queue {
		p.fail(r, p.stoppedErr(r, cause))
	}
	ps.queue, ps.queued = nil, 0
}

// resolve starts a metadata refresh for t unless one runs or is backing off.
func (p *Producer) resolve(t *topicState) {
	if t.resolving || p.now().Before(t.resolveAt) {
		return
	}
	t.resolving = true
	client := p.client
	topic := t.name
	go func() {
		m := topicMeta{topic: topic}
		if m.err = client.RefreshMetadata(topic); m.err == nil {
			var ids []int32
			if ids, m.err = client.Partitions(topic); m.err == nil {
				m.partitions = int32(len(ids))
				m.leaders = make(map[int32]*sarama.Broker, len(ids))
				for _, id := range ids {
					if b, err := client.Leader(topic, id); err == nil {
						m.leaders[id] = b
					}
				}
			}
		}
		select {
		case p.meta <- m:
		case <-p.stopped:
		}
	}()
}

func (p *Producer) handleMeta(m topicMeta) {
	t := p.topics[m.topic]
	t.resolving = false
	now := p.now()
	if m.err != nil || m.partitions == 0 {
		err := m.err
		if err == nil {
			err = sarama.ErrUnknownTopicOrPartition
		}
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) || errors.Is(err, sarama.ErrInvalidTopic) {
			// The topic does not exist: poison, as the pipeline defines it.
			pending := t.pending
			t.pending = nil
			for _, r := range pending {
				perr := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: err}
				p.fail(r, perr)
				if !p.cfg.ContinueAfterPoison && t.failed == nil {
					t.failed = perr
				}
			}
			if !p.cfg.ContinueAfterPoison {
				if t.failed == nil {
					t.failed = err
				}
				for _, ps := range t.parts {
					p.stopPartition(ps, t.failed)
				}
			}
			return
		}
		if t.failingAt.IsZero() {
			t.failingAt = now
		}
		t.attempts++
		if now.Sub(t.failingAt) >= p.cfg.DeliveryTimeout {
			p.log.Error("kafka metadata unavailable for longer than the delivery timeout: failing the topic's records",
				zap.String("topic", t.name), zap.Duration("delivery_timeout", p.cfg.DeliveryTimeout), zap.Error(err))
			t.failed = fmt.Errorf("no metadata for %s: %w", p.cfg.DeliveryTimeout, err)
			for _, r := range t.pending {
				p.fail(r, &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: t.failed})
			}
			t.pending = nil
			for _, ps := range t.parts {
				p.stopPartition(ps, t.failed)
			}
			return
		}
		t.resolveAt = now.Add(p.retryBackoff(t.attempts))
		if t.attempts == 1 || t.attempts%10 == 0 {
			p.log.Warn("kafka metadata unavailable; retrying", zap.String("topic", t.name),
				zap.Int("attempt", t.attempts), zap.Error(err))
		}
		return
	}
	t.failingAt, t.attempts = time.Time{}, 0
	if t.partitions != 0 && m.partitions < t.partitions {
		// Partitions never shrink; keep routing on the known count.
		m.partitions = t.partitions
	}
	if t.partitions != 0 && m.partitions != t.partitions {
		p.log.Warn("topic partition count changed: keys may move to other partitions",
			zap.String("topic", t.name), zap.Int32("from", t.partitions), zap.Int32("to", m.partitions))
	}
	t.partitions = m.partitions
	for id, ps := range t.parts {
		ps.leader = m.leaders[id]
	}
	pending := t.pending
	t.pending = nil
	for _, r := range pending {
		p.route(t, r)
	}
	for _, ps := range t.parts {
		if ps.leader == nil && (ps.batch != nil || len(ps.queue) > 0) {
			// No leader yet (an election): ask again after a backoff.
			t.attempts++
			t.resolveAt = now.Add(p.retryBackoff(t.attempts))
			break
		}
	}
}

// retryBackoff grows from RetryBackoff to RetryBackoffMax, with jitter.
func (p *Producer) retryBackoff(attempt int) time.Duration {
	return backoff.Jitter(backoff.Exponential(p.cfg.RetryBackoff, p.cfg.RetryBackoffMax, attempt))
}

// schedule sends one request to every idle broker that leads a partition
// with something to send, and returns when it next needs to run (zero: no
// timer).
func (p *Producer) schedule() time.Time {
	now := p.now()
	var wake time.Time
	soon := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	ready := make(map[int32][]*partitionState)
	needAdd := map[topicPartition]bool{}
	for _, t := range p.topics {
		if !t.resolving && !t.resolveAt.IsZero() && (len(t.pending) > 0 || t.needsLeader()) {
			if now.Before(t.resolveAt) {
				soon(t.resolveAt)
			} else {
				p.resolve(t)
			}
		}
		for _, ps := range t.parts {
			if (ps.batch == nil && len(ps.queue) == 0) || (ps.batch != nil && ps.batch.inFlight) {
				continue
			}
			if ps.leader == nil {
				p.resolve(t)
				continue
			}
			if ps.batch != nil && now.Before(ps.retryAt) {
				soon(ps.retryAt)
				continue
			}
			if ps.batch == nil && p.cfg.Linger > 0 && ps.queued < p.cfg.MaxMessageBytes {
				if due := ps.queue[0].enqueued.Add(p.cfg.Linger); now.Before(due) {
					soon(due)
					continue
				}
			}
			if !p.txnPartitionReady(ps, needAdd) {
				continue
			}
			id := ps.leader.ID()
			bs := p.brokers[id]
			if bs == nil {
				bs = &brokerState{b: ps.leader}
				p.brokers[id] = bs
			}
			if bs.busy {
				continue
			}
			bs.b = ps.leader
			ready[id] = append(ready[id], ps)
		}
	}
	p.startAdd(needAdd)
	for id, parts := range ready {
		p.send(p.brokers[id], parts)
	}
	return wake
}

func (t *topicState) needsLeader() bool {
	for _, ps := range t.parts {
		if ps.leader == nil && (ps.batch != nil || len(ps.queue) > 0) {
			return true
		}
	}
	return false
}

// recordOverhead bounds a record's framing in a batch (length, attributes,
// deltas, key/value lengths, header count): varints of at most 5 bytes.
const recordOverhead = 5 * 8

// batchOverhead is a record batch's header.
const batchOverhead = 61

func (p *Producer) send(bs *brokerState, parts []*partitionState) {
	req := &sarama.ProduceRequest{
		RequiredAcks: sarama.WaitForAll,
		Timeout:      int32(p.conf.Producer.Timeout / time.Millisecond),
		Version:      p.version,
	}
	if p.cfg.TransactionalID != "" {
		id := p.cfg.TransactionalID
		req.TransactionalID = &id
	}
	// A request never exceeds MaxRequestBytes (the broker's
	// socket.request.max.bytes): partitions that do not fit go in the
	// broker's next request, their batch built and waiting.
	size, sent := requestOverhead, parts[:0:0]
	for _, ps := range parts {
		if ps.batch == nil {
			ps.batch = p.newBatch(ps)
		}
		if len(sent) > 0 && size+ps.batch.bytes+batchOverhead > p.cfg.MaxRequestBytes {
			continue
		}
		size += ps.batch.bytes + batchOverhead
		sent = append(sent, ps)
		ps.batch.inFlight = true
		req.AddBatch(ps.topic.name, ps.partition, ps.batch.rb)
	}
	parts = sent
	bs.busy = true
	p.inflight++
	b := bs.b
	conf := p.conf
	go func() {
		if ok, _ := b.Connected(); !ok {
			_ = b.Open(conf)
		}
		// AsyncProduce, unlike Produce, does not hold the broker's lock while
		// it waits for the response, so Close can abort a request to a broker
		// that stopped answering. Its callback runs on the broker's response
		// reader and hands the response straight to run: p.resp has room
		// for more requests than are ever in flight (one per broker), and
		// should it not, a goroutine waits instead, never the reader.
		err := b.AsyncProduce(req, func(resp *sarama.ProduceResponse, err error) {
			p.respond(produceResponse{broker: b, parts: parts, resp: resp, err: err})
		})
		if err != nil {
			p.respond(produceResponse{broker: b, parts: parts, err: err})
		}
	}()
}

// respond hands a request's outcome to run without ever blocking the caller.
func (p *Producer) respond(pr produceResponse) {
	select {
	case p.resp <- pr:
	default:
		go func() { p.resp <- pr }()
	}
}

// newBatch takes the next records of ps's queue, up to MaxMessageBytes.
func (p *Producer) newBatch(ps *partitionState) *batch {
	limit := p.cfg.MaxMessageBytes - batchOverhead
	n, size := 0, 0
	for n < len(ps.queue) {
		s := ps.queue[n].Size() + recordOverhead
		if n > 0 && (size+s > limit || ps.single > 0) {
			break
		}
		size += s
		n++
	}
	if ps.single > 0 {
		ps.single--
	}
	recs := ps.queue[:n:n]
	ps.queue = ps.queue[n:]
	ps.queued -= size
	if len(ps.queue) == 0 {
		ps.queue = nil
	}

	first := recs[0].Timestamp
	if first.IsZero() {
		first = p.now()
	}
	first = first.Truncate(time.Millisecond)
	rb := &sarama.RecordBatch{
		Version:         2,
		ProducerID:      p.pid,
		ProducerEpoch:   p.epoch,
		FirstSequence:   ps.seq,
		FirstTimestamp:  first,
		MaxTimestamp:    first,
		LastOffsetDelta: int32(n - 1),
		IsTransactional: p.cfg.TransactionalID != "",
		Records:         make([]*sarama.Record, n),
	}
	_ = rb.Codec.UnmarshalText([]byte(p.cfg.Compression))
	rb.CompressionLevel = sarama.CompressionLevelDefault
	records := make([]sarama.Record, n)
	nh := 0
	for _, r := range recs {
		nh += len(r.Headers)
	}
	headers := make([]sarama.RecordHeader, nh)
	hptrs := make([]*sarama.RecordHeader, nh)
	for i, r := range recs {
		ts := r.Timestamp
		if ts.IsZero() {
			ts = first
		}
		ts = ts.Truncate(time.Millisecond)
		if ts.After(rb.MaxTimestamp) {
			rb.MaxTimestamp = ts
		}
		rec := &records[i]
		rec.Key = r.Key
		rec.Value = r.Value
		rec.OffsetDelta = int64(i)
		rec.TimestampDelta = ts.Sub(first)
		if len(r.Headers) > 0 {
			hs := hptrs[:len(r.Headers):len(r.Headers)]
			hptrs = hptrs[len(r.Headers):]
			for j, h := range r.Headers {
				headers[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
				hs[j] = &headers[j]
			}
			headers = headers[len(r.Headers):]
			rec.Headers = hs
		}
		rb.Records[i] = rec
	}
	return &batch{bytes: size, recs: recs, rb: rb}
}

// produceOutcome is what a partition's response means for its batch.
type produceOutcome int

const (
	outcomeAcked produceOutcome = iota
	outcomeRetry
	outcomeTooLarge // split the batch, or poison when it is one record
	outcomePoison
	outcomeFatal
)

func outcome(err error) produceOutcome {
	switch {
	case err == nil, errors.Is(err, sarama.ErrNoError), errors.Is(err, sarama.ErrDuplicateSequenceNumber):
		return outcomeAcked
	case errors.Is(err, sarama.ErrMessageSizeTooLarge), errors.Is(err, sarama.ErrMessageSetSizeTooLarge):
		return outcomeTooLarge
	case errors.Is(err, sarama.ErrInvalidRecord), errors.Is(err, sarama.ErrInvalidTimestamp),
		errors.Is(err, sarama.ErrInvalidMessage), errors.Is(err, sarama.ErrInvalidTopic):
		return outcomePoison
	case errors.Is(err, sarama.ErrNotLeaderForPartition), errors.Is(err, sarama.ErrLeaderNotAvailable),
		errors.Is(err, sarama.ErrRequestTimedOut), errors.Is(err, sarama.ErrNotEnoughReplicas),
		errors.Is(err, sarama.ErrNotEnoughReplicasAfterAppend), errors.Is(err, sarama.ErrKafkaStorageError),
		errors.Is(err, sarama.ErrNetworkException), errors.Is(err, sarama.ErrUnknownTopicOrPartition),
		errors.Is(err, sarama.ErrFencedLeaderEpoch), errors.Is(err, sarama.ErrUnknownLeaderEpoch),
		errors.Is(err, sarama.ErrOffsetNotAvailable), errors.Is(err, sarama.ErrThrottlingQuotaExceeded),
		errors.Is(err, sarama.ErrNotController), errors.Is(err, sarama.ErrBrokerNotAvailable),
		errors.Is(err, sarama.ErrIncompleteResponse):
		return outcomeRetry
	default:
		return outcomeFatal
	}
}

// leaderMoved reports whether err means the partition's leader is elsewhere
// or unknown, so metadata must be refreshed before the retry.
func leaderMoved(err error) bool {
	return errors.Is(err, sarama.ErrNotLeaderForPartition) || errors.Is(err, sarama.ErrLeaderNotAvailable) ||
		errors.Is(err, sarama.ErrUnknownTopicOrPartition) || errors.Is(err, sarama.ErrFencedLeaderEpoch) ||
		errors.Is(err, sarama.ErrUnknownLeaderEpoch) || errors.Is(err, sarama.ErrKafkaStorageError) ||
		errors.Is(err, sarama.ErrBrokerNotAvailable)
}

func (p *Producer) handleResponse(pr produceResponse) {
	if bs := p.brokers[pr.broker.ID()]; bs != nil {
		bs.busy = false
	}
	closing := p.closingNow()
	if pr.err != nil {
		// The request or its connection failed: the batches may or may not
		// have been appended. Resending them unchanged is safe (rule 2).
		go pr.broker.Close() // not here: Close waits for the broker's lock
		for _, ps := range pr.parts {
			p.retry(ps, fmt.Errorf("broker %s: %w", pr.broker.Addr(), pr.err), true, closing)
		}
		// Every other partition that broker leads waits for fresh metadata
		// too, rather than being sent to a broker that stopped answering.
		for _, t := range p.topics {
			for _, ps := range t.parts {
				if ps.leader != nil && ps.leader.ID() == pr.broker.ID() {
					ps.leader = nil
					t.resolveAt = time.Time{}
					p.resolve(t)
				}
			}
		}
		return
	}
	for _, ps := range pr.parts {
		var err error = sarama.ErrIncompleteResponse
		var block *sarama.ProduceResponseBlock
		if pr.resp != nil {
			block = pr.resp.GetBlock(ps.topic.name, ps.partition)
		}
		if block != nil {
			err = block.Err
		}
		b := ps.batch
		switch outcome(err) {
		case outcomeAcked:
			for i, r := range b.recs {
				r.Offset = -1
				if block.Offset >= 0 {
					r.Offset = block.Offset + int64(i)
				}
				p.emit(r)
			}
			ps.seq = nextSeq(ps.seq, len(b.recs))
			ps.batch = nil
			if !ps.failingAt.IsZero() && p.hooks.OnRecovered != nil {
				p.hooks.OnRecovered(ps.topic.name, ps.partition, p.now().Sub(ps.failingAt))
			}
			ps.failingAt, ps.attempts = time.Time{}, 0
		case outcomeRetry:
			p.retry(ps, err, leaderMoved(err), closing)
		case outcomeTooLarge:
			if len(b.recs) > 1 {
				// Rejected whole, so nothing was appended and no sequence
				// used: send its records one per batch to find the culprit.
				ps.queue = append(b.recs[:len(b.recs):len(b.recs)], ps.queue...)
				ps.single = len(b.recs)
				for _, r := range b.recs {
					ps.queued += r.Size() + recordOverhead
				}
				ps.batch = nil
				continue
			}
			ps.batch = nil
			p.poison(ps, b.recs[0], err)
		case outcomePoison:
			ps.batch = nil
			if len(b.recs) > 1 {
				ps.queue = append(b.recs[:len(b.recs):len(b.recs)], ps.queue...)
				ps.single = len(b.recs)
				for _, r := range b.recs {
					ps.queued += r.Size() + recordOverhead
				}
				continue
			}
			p.poison(ps, b.recs[0], err)
		case outcomeFatal:
			p.log.Error("kafka refused a batch for good: failing the partition's records",
				zap.String("topic", ps.topic.name), zap.Int32("partition", ps.partition), zap.Error(err))
			if fenced(err) {
				err = fmt.Errorf("%w: %w", ErrFenced, err)
			}
			p.stopPartition(ps, err)
			if p.cfg.TransactionalID != "" {
				p.failTxn(err)
			}
		}
		if closing {
			p.stopPartition(ps, ErrProducerClosed)
		}
	}
}

// retry schedules ps's batch to be sent again, unchanged, unless it has
// failed for longer than the delivery timeout or the producer is closing.
func (p *Producer) retry(ps *partitionState, err error, refresh, closing bool) {
	ps.batch.inFlight = false
	if closing {
		p.stopPartition(ps, ErrProducerClosed)
		return
	}
	now := p.now()
	if ps.failingAt.IsZero() {
		ps.failingAt = now
	}
	ps.attempts++
	if now.Sub(ps.failingAt) >= p.cfg.DeliveryTimeout {
		p.log.Error("kafka produce kept failing for the delivery timeout: failing the partition's records; the pipeline restarts from the last confirmed position",
			zap.String("topic", ps.topic.name), zap.Int32("partition", ps.partition),
			zap.Duration("delivery_timeout", p.cfg.DeliveryTimeout), zap.Int("attempts", ps.attempts), zap.Error(err))
		err = fmt.Errorf("delivery timeout %s after %d attempts: %w", p.cfg.DeliveryTimeout, ps.attempts, err)
		p.stopPartition(ps, err)
		if p.cfg.TransactionalID != "" {
			p.failTxn(err)
		}
		return
	}
	ps.retryAt = now.Add(p.retryBackoff(ps.attempts))
	if ps.attempts == 1 || ps.attempts%10 == 0 {
		p.log.Warn("kafka produce failed; sending the same batch again",
			zap.String("topic", ps.topic.name), zap.Int32("partition", ps.partition),
			zap.Int("attempt", ps.attempts), zap.Error(err))
	}
	if p.hooks.OnRetry != nil {
		p.hooks.OnRetry(ps.topic.name, ps.partition, ps.attempts, err)
	}
	if refresh {
		ps.leader = nil
		t := ps.topic
		if t.resolveAt.Before(now) {
			t.resolveAt = time.Time{}
		}
		p.resolve(t)
	}
}

// nextSeq adds n to a sequence number; sequences wrap to 0 after MaxInt32.
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (1 << 31))
}
