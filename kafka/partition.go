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
//	inFlight, stopping ──expire──▶ abandoned ──land──▶ stopped
//	                                              (the delivery timeout passed
//	                                               unanswered: the records
//	                                               failed; the answer is dropped)
//	idle, waiting ──expire──▶ stopped             (the delivery timeout passed
//	                                               unsent: no leader, or no
//	                                               answer to its broker's request)
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
	// partAbandoned: its batch's delivery timeout passed while the batch
	// was in flight: its records have failed, and the response, whenever
	// it comes, decides nothing. Waiting for it instead would let a
	// request that is never answered (a broker whose bytes are held, no
	// connection closed) hold the records for as long as the network
	// does; the batch stays only so that land finds it.
	partAbandoned
)

var phaseNames = [...]string{"idle", "in flight", "waiting", "stopping", "stopped", "abandoned"}

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
	batch     *batch         // set exactly in inFlight, waiting, stopping and abandoned
	seq       int32          // first sequence of the next new batch
	single    int            // send this many next records one per batch
	retryAt   time.Time
	failingAt time.Time // first failure of the current batch
	urgent    bool      // the queue holds an Urgent record: no linger
	attempts  int
	lastErr   error // of the last failed attempt of the current batch
	// landed is when its last batch came back: the head of the queue
	// could not be sent before, so its delivery timeout runs from then at
	// the earliest (see deadline).
	landed time.Time
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
	return !rb.hasWork() && rb.phase != partInFlight && rb.phase != partStopping && rb.phase != partAbandoned
}

// deadline is when the oldest record rb holds reaches its delivery
// timeout (zero: it holds none it could still deliver). A record's timeout
// runs from its first attempt, answered or not: a batch's from its first
// send; a queued record's from when it could first have been sent (queued,
// and nothing of its partition in flight), so a partition without a
// leader, or whose broker never answers, fails its records instead of
// holding them unseen.
func (rb *recBuf) deadline(timeout time.Duration) time.Time {
	switch rb.phase {
	case partInFlight, partWaiting, partStopping:
		if rb.batch.sent.IsZero() {
			return time.Time{}
		}
		return rb.batch.sent.Add(timeout)
	case partIdle:
		if len(rb.queue) == 0 {
			return time.Time{}
		}
		from := rb.queue[0].enqueued
		if rb.landed.After(from) {
			from = rb.landed
		}
		return from.Add(timeout)
	default:
		return time.Time{}
	}
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

// land takes rb's batch back from a request that finished at now.
// stopCause is set when rb was stopped while the batch was in flight: rb is
// then stopped, and the caller settles the batch's records with it. b is
// nil when there is nothing to decide: with stopCause set, the batch was
// abandoned at its delivery timeout (its records have failed: the answer
// is dropped); without, rb had no batch in flight (never expected; the
// caller logs and ignores the response).
func (rb *recBuf) land(now time.Time) (b *batch, stopCause error) {
	switch rb.phase {
	case partInFlight:
		b, rb.batch, rb.phase, rb.landed = rb.batch, nil, partIdle, now
		return b, nil
	case partStopping:
		b, rb.batch, rb.phase = rb.batch, nil, partStopped
		return b, rb.failed
	case partAbandoned:
		rb.batch, rb.phase = nil, partStopped
		return nil, rb.failed
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

// expire fails rb's records at their delivery timeout, with cause for the
// oldest (the batch, or the head of the queue) and as unsent for those
// behind it, and stops rb: nothing later of the partition is sent (rule
// 3). A batch in flight is abandoned (see partAbandoned). It reports
// whether a batch was in flight, whose request the caller aborts.
func (rb *recBuf) expire(p *Producer, cause error) (inFlight bool) {
	switch rb.phase {
	case partInFlight, partStopping:
		rb.batch.settle(p, cause)
		inFlight = true
	case partWaiting:
		rb.batch.settle(p, cause)
		rb.batch, rb.phase = nil, partIdle
	case partIdle:
		if len(rb.queue) > 0 {
			head := rb.queue[0]
			rb.queue[0] = nil // the array must not keep it (see newBatch)
			rb.queue = rb.queue[1:]
			rb.queued -= head.Size() + recordOverhead
			p.fail(head, recordErr(head, cause))
		}
	}
	if rb.failed == nil {
		rb.failed = cause
	}
	for _, r := range rb.takeQueue() {
		p.fail(r, stoppedErr(r, cause))
	}
	if inFlight {
		rb.phase = partAbandoned
	} else {
		rb.phase = partStopped
	}
	return inFlight
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
	// partAbandoned, partStopping, partStopped: already stopped.
}
