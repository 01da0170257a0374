package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// partPhase is where a partition's batch is. Only the recBuf verbs below
// change it, and a batch exists exactly in the phases that hold one, so a
// response always finds the batch it carried:
//
//	idle ──take──▶ inFlight ──land──▶ idle        (acked, split, poison)
//	                  │  ▲             waiting     (retriable: same batch)
//	     waiting ──take┘  │
//	inFlight ──stop──▶ stopping ──land──▶ stopped (the response decides
//	                                                the batch's records)
//	idle, waiting ──stop──▶ stopped
//	waiting ──unwait──▶ idle                      (the topic is missing: the
//	                                                batch's records are poison)
//
// Before this was explicit, stopping a partition (a metadata refresh saying
// its topic is unknown) dropped a batch still in flight, and its response
// then dereferenced the missing batch: a panic.
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

// recBuf is one partition's record buffer: the records queued for it, the
// one batch it may have out, and its phase. Its verbs are the only code
// that moves records between the queue, the batch and the caller; like
// everything of the producer's state, it is used on run's goroutine only.
// Verbs that need the Producer that owns the buffer (to build a batch
// with its id and epoch, or to hand records back) take it as an argument.
type recBuf struct {
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
	urgent    bool      // the queue holds an Urgent record: no linger
	attempts  int
	// failed, when set, refuses new records. A partition sealed by a
	// poison record (see seal) still sends what it holds; a stopped one
	// holds nothing.
	failed error
}

// hasWork reports whether rb has something to send now or later.
func (rb *recBuf) hasWork() bool {
	return rb.phase == partWaiting || (rb.phase == partIdle && len(rb.queue) > 0)
}

// drained reports whether rb holds no record: nothing queued, no batch.
func (rb *recBuf) drained() bool {
	return !rb.hasWork() && rb.phase != partInFlight && rb.phase != partStopping
}

// due reports whether rb's next batch may go now; if not, the time it may
// (a waiting batch's retry, the queue's linger).
func (rb *recBuf) due(now time.Time, linger time.Duration, maxBytes int) (bool, time.Time) {
	if rb.phase == partWaiting && now.Before(rb.retryAt) {
		return false, rb.retryAt
	}
	if rb.phase == partIdle && linger > 0 && rb.queued < maxBytes && !rb.urgent {
		if due := rb.queue[0].enqueued.Add(linger); now.Before(due) {
			return false, due
		}
	}
	return true, time.Time{}
}

// push queues r, which arrived at now.
func (rb *recBuf) push(r *Record, now time.Time) {
	r.enqueued = now
	rb.urgent = rb.urgent || r.Urgent
	rb.queue = append(rb.queue, r)
	rb.queued += r.Size() + recordOverhead
}

// seal refuses every record after now with err; what rb holds still goes.
func (rb *recBuf) seal(err error) {
	rb.failed = err
}

// take moves rb's batch into a request: a new batch from the queue when
// idle, the same batch again when waiting.
func (rb *recBuf) take(p *Producer) *batch {
	if rb.phase == partIdle {
		rb.batch = p.newBatch(rb)
		rb.batch.sent = p.now()
	}
	rb.phase = partInFlight
	return rb.batch
}

// land takes rb's batch back from a finished request. stopCause is set
// when rb was stopped while the batch was in flight: rb is then stopped,
// and the caller settles the batch's records with it. b is nil when rb had
// no batch in flight (never expected; the caller ignores the response).
func (rb *recBuf) land() (b *batch, stopCause error) {
	switch rb.phase {
	case partInFlight:
		b, rb.batch, rb.phase = rb.batch, nil, partIdle
		return b, nil
	case partStopping:
		b, rb.batch, rb.phase = rb.batch, nil, partStopped
		return b, rb.failed
	default:
		return nil, nil
	}
}

// wait puts b back to be sent again unchanged at retryAt.
func (rb *recBuf) wait(b *batch) {
	rb.batch, rb.phase = b, partWaiting
}

// unwait takes back the records of the batch waiting to be sent again,
// leaving rb idle; nil when none waits.
func (rb *recBuf) unwait() []*Record {
	if rb.phase != partWaiting {
		return nil
	}
	recs := rb.batch.recs
	rb.batch, rb.phase = nil, partIdle
	return recs
}

// requeue puts the records of b, refused whole (so nothing was appended
// and no sequence used), back at the front of the queue, to be sent one
// per batch to find the one the broker refuses.
func (rb *recBuf) requeue(b *batch) {
	rb.queue = append(b.recs[:len(b.recs):len(b.recs)], rb.queue...)
	rb.single = len(b.recs)
	for _, r := range b.recs {
		rb.queued += r.Size() + recordOverhead
		rb.urgent = rb.urgent || r.Urgent
	}
}

// takeQueue empties the queue and returns what it held.
func (rb *recBuf) takeQueue() []*Record {
	queue := rb.queue
	rb.queue, rb.queued, rb.urgent = nil, 0, false
	return queue
}

// poison refuses r for good: alone when the pipeline continues after poison,
// otherwise together with everything behind it in its partition.
func (rb *recBuf) poison(p *Producer, r *Record, cause error) {
	err := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: cause}
	p.fail(r, err)
	if !p.cfg.ContinueAfterPoison {
		rb.stop(p, err)
	}
}

// stop fails rb's queue, and its batch unless that is in flight (its
// response settles it: see land); every later record of the partition
// fails at once.
func (rb *recBuf) stop(p *Producer, cause error) {
	if rb.failed == nil {
		rb.failed = cause
	}
	for _, r := range rb.takeQueue() {
		p.fail(r, stoppedErr(r, cause))
	}
	switch rb.phase {
	case partInFlight:
		rb.phase = partStopping
	case partWaiting:
		rb.batch.settle(p, cause)
		rb.batch, rb.phase = nil, partStopped
	case partIdle:
		rb.phase = partStopped
	}
}
