package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// partPhase is where a partition's batch is. Only the transitions below
// change it, and a batch exists exactly in the phases that hold one, so a
// response always finds the batch it carried:
//
//	idle ──send──▶ inFlight ──land──▶ idle        (acked, split, poison)
//	                  │  ▲             waiting     (retriable: same batch)
//	     waiting ──send┘  │
//	inFlight ──stop──▶ stopping ──land──▶ stopped (the response decides
//	                                                the batch's records)
//	idle, waiting ──stop──▶ stopped
//
// Before this was explicit, stopping a partition (a metadata refresh saying
// its topic is unknown) dropped a batch still in flight, and its response
// then dereferenced the missing batch (issue 22).
type partPhase uint8

const (
	// partIdle: no batch; records may wait in the queue.
	partIdle partPhase = iota
	// partInFlight: the batch is in a request; only land leaves it.
	partInFlight
	// partWaiting: the batch failed with a retriable error and waits for
	// retryAt (and a leader) to be sent again, unchanged.
	partWaiting
	// partStopping: stopped while its batch was in flight: the queue has
	// failed; the response decides the batch (acked records are acked,
	// anything else fails with the stop's cause).
	partStopping
	// partStopped: holds nothing; every new record fails with failed.
	partStopped
)

var phaseNames = [...]string{"idle", "in flight", "waiting", "stopping", "stopped"}

func (ph partPhase) String() string { return phaseNames[ph] }

type partitionState struct {
	topic     *topicState
	partition int32
	phase     partPhase
	leader    *sarama.Broker // nil: unknown, resolve the topic
	queue     []*Record      // not yet in a batch, in order
	queued    int            // bytes in queue
	batch     *batch         // set exactly in inFlight, waiting and stopping
	seq       int32          // first sequence of the next new batch
	single    int            // send this many next records one per batch
	retryAt   time.Time
	failingAt time.Time // first failure of the current batch
	attempts  int
	// failed, when set, refuses new records. A partition sealed by a
	// poison record (see route) still sends what it holds; a stopped one
	// holds nothing.
	failed error
}

type batch struct {
	sent  time.Time // when it was first sent
	bytes int       // the records' size in the batch, at most MaxMessageBytes
	recs  []*Record
	rb    *sarama.RecordBatch
}

// hasWork reports whether ps has something to send now or later.
func (ps *partitionState) hasWork() bool {
	return ps.phase == partWaiting || (ps.phase == partIdle && len(ps.queue) > 0)
}

// take moves ps's batch into a request: a new batch from the queue when
// idle, the same batch again when waiting.
func (p *Producer) take(ps *partitionState) *batch {
	if ps.phase == partIdle {
		ps.batch = p.newBatch(ps)
		ps.batch.sent = p.now()
	}
	ps.phase = partInFlight
	return ps.batch
}

// land takes ps's batch back from a finished request. stopCause is set
// when ps was stopped while the batch was in flight: ps is then stopped,
// and the caller settles the batch's records with it. b is nil when ps had
// no batch in flight (never expected; the caller ignores the response).
func (ps *partitionState) land() (b *batch, stopCause error) {
	switch ps.phase {
	case partInFlight:
		b, ps.batch, ps.phase = ps.batch, nil, partIdle
		return b, nil
	case partStopping:
		b, ps.batch, ps.phase = ps.batch, nil, partStopped
		return b, ps.failed
	default:
		return nil, nil
	}
}

// wait puts b back to be sent again unchanged at retryAt.
func (ps *partitionState) wait(b *batch) {
	ps.batch, ps.phase = b, partWaiting
}

// poison refuses r for good: alone when the pipeline continues after poison,
// otherwise together with everything behind it in its partition.
func (p *Producer) poison(ps *partitionState, r *Record, cause error) {
	err := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: cause}
	p.fail(r, err)
	if !p.cfg.ContinueAfterPoison {
		p.stopPartition(ps, err)
	}
}

// stopPartition fails the partition's queue, and its batch unless that is in
// flight (its response settles it: see land); every later record of the
// partition fails at once.
func (p *Producer) stopPartition(ps *partitionState, cause error) {
	if ps.failed == nil {
		ps.failed = cause
	}
	for _, r := range ps.queue {
		p.fail(r, p.stoppedErr(r, cause))
	}
	ps.queue, ps.queued = nil, 0
	switch ps.phase {
	case partInFlight:
		ps.phase = partStopping
	case partWaiting:
		for _, r := range ps.batch.recs {
			p.fail(r, p.recordErr(r, cause))
		}
		ps.batch, ps.phase = nil, partStopped
	case partIdle:
		ps.phase = partStopped
	}
}

// settle fails the records of a batch that came back after its partition
// was stopped, unless the broker acknowledged them.
func (p *Producer) settle(b *batch, cause error) {
	for _, r := range b.recs {
		p.fail(r, p.recordErr(r, cause))
	}
}
