package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

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
	// INVALID_TIMESTAMP is not poison: it is fatal (see TimestampError).
	case errors.Is(err, sarama.ErrInvalidRecord),
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

// forgetLeader makes every partition broker leads wait for fresh metadata,
// rather than being sent to a broker that stopped answering.
func (p *Producer) forgetLeader(broker *sarama.Broker) {
	for _, t := range p.topics {
		for _, rb := range t.parts {
			if rb.leader != nil && rb.leader.ID() == broker.ID() {
				rb.leader = nil
				t.resolveAt = time.Time{}
				p.resolve(t)
			}
		}
	}
}

// strayResponse handles a response that found no batch to decide: a batch
// abandoned at its delivery timeout (abandoned is its cause; its records
// failed already), else a partition that had no batch in flight. The phases
// make the latter impossible; should it happen anyway, the response is
// ignored rather than crash the process.
func (p *Producer) strayResponse(rb *recBuf, abandoned error) {
	if abandoned != nil {
		return
	}
	p.log.Error("kafka produce response for a partition with no batch in flight: ignored (a bug: please report it)",
		zap.String("topic", rb.topic.name), zap.Int32("partition", rb.partition), zap.Stringer("phase", rb.phase))
}

// acked hands back the records of an acknowledged batch, in order.
func (p *Producer) acked(rb *recBuf, b *batch, offset int64) {
	b.ack(p, offset)
	rb.seq = nextSeq(rb.seq, len(b.recs))
	if !rb.failingAt.IsZero() && p.hooks.OnRecovered != nil {
		p.hooks.OnRecovered(rb.topic.name, rb.partition, p.now().Sub(rb.failingAt))
	}
	rb.failingAt, rb.attempts, rb.lastErr = time.Time{}, 0, nil
}

// refused handles a batch the broker refused with err; rb is idle again.
func (p *Producer) refused(rb *recBuf, b *batch, err error) {
	if t := rb.topic; t.missing != nil && errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		// The topic is gone (the lookups said so for UnknownTopicTimeout):
		// the batch was not appended; its records are poison.
		for _, r := range b.recs {
			rb.poison(p, r, t.missing)
		}
		return
	}
	switch outcome(err) {
	case outcomeRetry:
		p.retry(rb, b, err, leaderMoved(err))
	case outcomeTooLarge, outcomePoison:
		if len(b.recs) > 1 {
			// Rejected whole, so nothing was appended and no sequence
			// used: send its records one per batch to find the culprit.
			rb.requeue(b)
			return
		}
		rb.poison(p, b.recs[0], err)
	default:
		if errors.Is(err, sarama.ErrInvalidTimestamp) {
			err = &TimestampError{Topic: rb.topic.name, Partition: rb.partition,
				First: b.rb.FirstTimestamp, Last: b.rb.MaxTimestamp, Now: p.now(), Err: err}
		}
		p.log.Error("kafka refused a batch for good: failing the partition's records",
			zap.String("topic", rb.topic.name), zap.Int32("partition", rb.partition), zap.Error(err))
		if !b.sent.IsZero() {
			// The wait for this answer was Kafka's too: a leader or
			// coordinator that was away answers late, and then with the
			// epoch its abort bumped (classifyTxnErr).
			p.noteTxnFailing(p.now().Sub(b.sent))
		}
		err = p.classifyTxnErr(err)
		b.settle(p, err)
		rb.stop(p, err)
		if p.cfg.TransactionalID != "" {
			p.failTxn(err)
		}
	}
}

// retry schedules b to be sent again, unchanged, unless its delivery
// timeout passed.
func (p *Producer) retry(rb *recBuf, b *batch, err error, refresh bool) {
	rb.wait(b)
	now := p.now()
	if rb.failingAt.IsZero() {
		rb.failingAt = now
	}
	rb.attempts++
	rb.lastErr = err
	if !b.sent.IsZero() {
		p.noteTxnFailing(now.Sub(b.sent))
	}
	if !b.sent.IsZero() && now.Sub(b.sent) >= p.cfg.DeliveryTimeout {
		p.deliveryTimedOut(rb, err)
		return
	}
	rb.retryAt = now.Add(p.retryBackoff(rb.attempts))
	if rb.attempts == 1 || rb.attempts%10 == 0 {
		p.log.Warn("kafka produce failed; sending the same batch again",
			zap.String("topic", rb.topic.name), zap.Int32("partition", rb.partition),
			zap.Int("attempt", rb.attempts), zap.Error(err))
	}
	if p.hooks.OnRetry != nil {
		p.hooks.OnRetry(rb.topic.name, rb.partition, rb.attempts, err)
	}
	if refresh {
		rb.leader = nil
		t := rb.topic
		if t.resolveAt.Before(now) {
			t.resolveAt = time.Time{}
		}
		p.resolve(t)
	}
}

// expireDue fails rb's records if their delivery timeout passed by now
// (see recBuf.deadline), and returns when it next will (zero: none).
func (p *Producer) expireDue(rb *recBuf, now time.Time) time.Time {
	at := rb.deadline(p.cfg.DeliveryTimeout)
	if at.IsZero() || now.Before(at) {
		return at
	}
	p.deliveryTimedOut(rb, p.undelivered(rb))
	return time.Time{}
}

// undelivered says why rb's oldest record is still not delivered, for a
// delivery timeout that passed with no answer to decide it.
func (p *Producer) undelivered(rb *recBuf) error {
	switch {
	case (rb.phase == partInFlight || rb.phase == partStopping) && rb.batch.via != nil && rb.lastErr != nil:
		// A retry was still out: the answer to the attempt before it is
		// what the operator needs to see (a leader that kept refusing).
		return fmt.Errorf("%w from broker %s to the retry in flight, after the last attempt failed: %w", errNoAnswer, rb.batch.via.b.Addr(), rb.lastErr)
	case (rb.phase == partInFlight || rb.phase == partStopping) && rb.batch.via != nil:
		return fmt.Errorf("%w from broker %s to the produce request", errNoAnswer, rb.batch.via.b.Addr())
	case rb.leader == nil && rb.lastErr != nil:
		return fmt.Errorf("%w since the last attempt failed: %w", errNoLeader, rb.lastErr)
	case rb.leader == nil:
		return errNoLeader
	case rb.lastErr != nil:
		return rb.lastErr
	case p.cfg.TransactionalID != "" && !p.txn.added[topicPartition{rb.topic.name, rb.partition}]:
		return fmt.Errorf("%w to adding the partition to the transaction", errNoAnswer)
	default:
		return fmt.Errorf("%w from broker %s to the request in flight before it", errNoAnswer, rb.leader.Addr())
	}
}

var (
	errNoLeader = errors.New("no leader known for the partition")
	errNoAnswer = errors.New("no answer")
)

// deliveryTimedOut fails rb's records, the oldest at its delivery timeout
// with cause and those behind it unsent, and stops rb (rule 3): the
// pipeline restarts from the last confirmed position. A request still
// carrying rb's batch is aborted, so its broker's sink is free again.
func (p *Producer) deliveryTimedOut(rb *recBuf, cause error) {
	p.log.Error("kafka produce not delivered within the delivery timeout: failing the partition's records; the pipeline restarts from the last confirmed position",
		zap.String("topic", rb.topic.name), zap.Int32("partition", rb.partition), zap.Stringer("phase", rb.phase),
		zap.Duration("delivery_timeout", p.cfg.DeliveryTimeout), zap.Int("attempts", rb.attempts), zap.Error(cause))
	err := fmt.Errorf("delivery timeout %s since the first attempt, %d failed attempts: %w", p.cfg.DeliveryTimeout, rb.attempts, cause)
	var via *sink
	if rb.batch != nil {
		via = rb.batch.via
	}
	if rb.expire(p, err) && via != nil {
		via.abort()
	}
	if p.cfg.TransactionalID != "" {
		p.failTxn(err)
	}
}

// nextSeq adds n to a sequence number; sequences wrap to 0 after MaxInt32.
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (1 << 31))
}
