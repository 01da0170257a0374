package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
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
// commit order. sarama fails a record without failing those behind
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
//     producer, not authorised), or that is not delivered within
//     DeliveryTimeout of its first attempt, fails together with every
//     record queued behind it in its partition, none of which is sent; so
//     is every later record of that partition until the producer is
//     closed. The pipeline restarts from the last confirmed position and
//     sends them again, in order. The delivery timeout is the run loop's
//     own deadline (recBuf.deadline, checked by schedule), not a check made
//     when an answer arrives: a partition that has no leader and a request
//     its broker never answers (bytes held, no connection closed) would
//     otherwise hold their records for as long as the fault lasts, with
//     nothing said. A batch still in flight at its deadline fails at once
//     and its request is aborted; its answer, should one come, is dropped.
//  4. A poison record (too large, unknown topic, invalid) is refused alone
//     when ContinueAfterPoison is set (the pipeline diverts it to the
//     dead-letter topic); otherwise it stops its partition like rule 3, as the
//     pipeline halts on it.
//
// A record comes back on Results exactly once, acknowledged or failed; the
// acknowledged records of one partition come back in the order they were
// sent.
//
// # Parts
//
// A record is routed to its partition's record buffer (recBuf,
// partition.go): its queue, the one batch it may have out, and its phase,
// which only the recBuf's verbs change (take, land, wait, stop, poison).
// schedule (schedule.go) hands every recBuf ready to send to the sink of
// its leader (sink.go), one per broker, which builds one request from
// their batches (batch.go), keeps it the broker's only request in flight,
// and on the answer lands each batch back in its recBuf; what the answer
// means for the batch — ack, retry, split, poison, stop — is in
// response.go. Metadata (metadata.go) finds partitions and leaders; the
// transaction is in txn.go.
//
// # Goroutines
//
// One goroutine, run, owns all state (topics, recBufs, sinks, the
// transaction). Kafka I/O runs in goroutines run starts with spawn — one per
// request in flight (a sink's: at most one per broker), per metadata
// lookup, per transaction call, per broker closed at shutdown — which report
// back on channels; run waits for all of them before it returns, and Close
// waits for run. The one goroutine that may outlive Close hands back
// results nobody had read yet, and ends once they were.
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
	stopped chan struct{} // closed when run's loop ends
	exited  chan struct{} // closed when run returned: Close waits for it
	results chan *Record
	// goroutines are every goroutine run starts (requests, metadata
	// lookups, transaction calls, broker closes): run waits for them all
	// before it returns. Only spawn starts them.
	goroutines sync.WaitGroup

	txnCtl chan *txnRequest
	added  chan addResult
	ended  chan error

	// Owned by the run goroutine.
	txn         txnState
	outstanding int // records accepted and not yet back
	topics      map[string]*topicState
	sinks       map[int32]*sink // by broker id
	inflight    int             // requests in flight
	now         func() time.Time
	// backlog holds results that came back after Close while nobody read
	// Results, in order: Close never waits for a reader (see emit).
	backlog []*Record

	// txnOpened is when the current transaction's first partition was
	// added (unix ns; zero: none open). Atomic: the coordinator calls
	// classify errors from their own goroutines.
	txnOpened atomic.Int64
	// txnFailing is the longest time one request of the current
	// transaction kept failing (ns): a produce batch from its first send to
	// its last retriable failure, a coordinator request likewise. How much
	// of the transaction's age Kafka's failures took (see classifyTxnErr).
	txnFailing atomic.Int64

	// testRespond, when set, runs before a produce response reaches run,
	// in its own goroutine (tests hold responses with it).
	testRespond func(produceResponse)
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
	parts      map[int32]*recBuf
	pending    []*Record // waiting for the partition count
	resolving  bool
	resolveAt  time.Time // earliest next metadata refresh
	failingAt  time.Time // first failed refresh of the current run of failures
	attempts   int
	failed     error // every record of the topic fails with it
	// unknownSince is the first of the current run of lookups that called
	// the topic unknown; missing is set once that lasted
	// UnknownTopicTimeout (see unknownTopic).
	unknownSince time.Time
	missing      error
	// refreshAt is when the topic's metadata is looked up again even if
	// nothing failed: how a partition count change is noticed.
	refreshAt time.Time
	// nextPartitions is a new partition count waiting for the old
	// partitions to drain (see repartitioned); leaders are the latest.
	nextPartitions int32
	leaders        map[int32]*sarama.Broker
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
	// sarama asks once more itself when a lookup calls a topic unknown or
	// leaderless; the producer's own lookups back off from metaBackoffMin
	// (see resolve), and so does that second ask, not from RetryBackoff.
	conf.Metadata.Retry.Backoff = min(cfg.RetryBackoff, metaBackoffMin)
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
		exited:  make(chan struct{}),
		results: make(chan *Record, 4096),
		topics:  make(map[string]*topicState),
		sinks:   make(map[int32]*sink),
		now:     time.Now,
	}
	if cfg.TransactionalID != "" {
		err = p.initTransactional()
	} else {
		err = p.initIdempotent()
	}
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka producer: init producer id: %w", err)
	}
	go p.run()
	return p, nil
}

// initIdempotent gets the idempotent producer's id and epoch. A broker that
// has just started answers COORDINATOR_LOAD_IN_PROGRESS until it holds a
// block of producer ids: that and the other retriable answers are asked
// again with backoff, up to the delivery timeout.
func (p *Producer) initIdempotent() error {
	deadline := time.Now().Add(p.cfg.DeliveryTimeout)
	for attempt := 1; ; attempt++ {
		resp, err := p.client.InitProducerID()
		if err == nil && !errors.Is(resp.Err, sarama.ErrNoError) {
			err = resp.Err
		}
		if err == nil {
			p.pid, p.epoch = resp.ProducerID, resp.ProducerEpoch
			return nil
		}
		if !coordinatorRetriable(err) || time.Now().After(deadline) {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			p.log.Warn("kafka: init producer id failed; retrying", zap.Int("attempt", attempt), zap.Error(err))
		}
		time.Sleep(backoff.Jitter(backoff.Exponential(p.cfg.RetryBackoff, p.cfg.RetryBackoffMax, attempt)))
	}
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
// pipeline's restart sends them again. Close returns once the run loop and
// every goroutine it started have returned; Results is closed once every
// record came back (Close does not wait for Results to be read).
func (p *Producer) Close() error {
	p.closeMu.Do(func() { close(p.closing) })
	<-p.exited
	return nil
}

// spawn starts f in a goroutine run owns: run waits for it before it
// returns. Called by run, or (respond) by a request run waits for.
func (p *Producer) spawn(f func()) {
	p.goroutines.Add(1)
	go func() {
		defer p.goroutines.Done()
		f()
	}()
}

// run owns the producer's state: it routes records to partitions, builds
// one request per idle broker, and handles responses and metadata. Kafka I/O
// runs in short-lived goroutines (spawn) that report back on resp and meta.
// When its loop ends it closes the client, which ends the lookups still
// running, waits for every goroutine it started, and hands the results back.
func (p *Producer) run() {
	defer close(p.exited)
	defer func() {
		close(p.stopped) // goroutines with something to report give up
		p.client.Close()
		p.goroutines.Wait()
		p.handBack()
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
			pr.sink.handle(pr)
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
			p.fail(r, closedErr(r))
		}
		t.pending = nil
		for _, rb := range t.parts {
			rb.stop(p, ErrProducerClosed) // in flight: settled by its response
		}
	}
	for _, s := range p.sinks {
		s.abort() // the request in flight returns with an error
	}
	// Drain records a Send or SendBatch raced in before it saw closing.
	for {
		select {
		case r := <-p.in:
			p.fail(r, closedErr(r))
		case rs := <-p.inBatch:
			for _, r := range rs {
				p.fail(r, closedErr(r))
			}
		default:
			return
		}
	}
}

// emit hands r back: on r.Done when set, else on Results. After Close,
// with nobody reading Results, the rest wait in the backlog, in order, so
// that run can end and Close return (handBack delivers them).
func (p *Producer) emit(r *Record) {
	p.outstanding--
	if r.Done != nil {
		r.Done <- r
		return
	}
	if len(p.backlog) == 0 {
		select {
		case p.results <- r:
			return
		case <-p.closing:
		}
	}
	p.backlog = append(p.backlog, r)
}

// handBack closes Results after the backlog, if any: a last goroutine
// delivers it, ending once the caller has read every record (the
// Producer contract: every record comes back, then Results is closed).
func (p *Producer) handBack() {
	backlog := p.backlog
	if len(backlog) == 0 {
		close(p.results)
		return
	}
	p.backlog = nil
	go func() {
		for _, r := range backlog {
			p.results <- r
		}
		close(p.results)
	}()
}

func (p *Producer) fail(r *Record, err error) {
	r.Err = err
	p.emit(r)
}
