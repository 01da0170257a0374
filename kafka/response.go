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
	if pr.err != nil {
		// The request or its connection failed: the batches may or may not
		// have been appended. Resending them unchanged is safe (rule 2).
		go pr.broker.Close() // not here: Close waits for the broker's lock
		for _, ps := range pr.parts {
			b, stopCause := ps.land()
			switch {
			case b == nil:
				p.strayResponse(ps)
			case stopCause != nil:
				p.settle(b, stopCause)
			default:
				p.retry(ps, b, fmt.Errorf("broker %s: %w", pr.broker.Addr(), pr.err), true)
			}
		}
		p.forgetLeader(pr.broker)
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
		b, stopCause := ps.land()
		switch {
		case b == nil:
			p.strayResponse(ps)
		case outcome(err) == outcomeAcked:
			p.acked(ps, b, block.Offset)
		case stopCause != nil:
			p.settle(b, stopCause)
		default:
			p.refused(ps, b, err)
		}
	}
}

// forgetLeader makes every partition broker leads wait for fresh metadata,
// rather than being sent to a broker that stopped answering.
func (p *Producer) forgetLeader(broker *sarama.Broker) {
	for _, t := range p.topics {
		for _, ps := range t.parts {
			if ps.leader != nil && ps.leader.ID() == broker.ID() {
				ps.leader = nil
				t.resolveAt = time.Time{}
				p.resolve(t)
			}
		}
	}
}

// strayResponse logs a response for a partition that had no batch in
// flight. The phases make it impossible; should it happen anyway, the
// response is ignored rather than crash the process.
func (p *Producer) strayResponse(ps *partitionState) {
	p.log.Error("kafka produce response for a partition with no batch in flight: ignored (a bug: please report it)",
		zap.String("topic", ps.topic.name), zap.Int32("partition", ps.partition), zap.Stringer("phase", ps.phase))
}

// acked hands back the records of an acknowledged batch, in order.
func (p *Producer) acked(ps *partitionState, b *batch, offset int64) {
	for i, r := range b.recs {
		r.Offset = -1
		if offset >= 0 {
			r.Offset = offset + int64(i)
		}
		p.emit(r)
	}
	ps.seq = nextSeq(ps.seq, len(b.recs))
	if !ps.failingAt.IsZero() && p.hooks.OnRecovered != nil {
		p.hooks.OnRecovered(ps.topic.name, ps.partition, p.now().Sub(ps.failingAt))
	}
	ps.failingAt, ps.attempts = time.Time{}, 0
}

// refused handles a batch the broker refused with err; ps is idle again.
func (p *Producer) refused(ps *partitionState, b *batch, err error) {
	if t := ps.topic; t.missing != nil && errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		// The topic is gone (the lookups said so for UnknownTopicTimeout):
		// the batch was not appended; its records are poison.
		for _, r := range b.recs {
			p.poison(ps, r, t.missing)
		}
		return
	}
	switch outcome(err) {
	case outcomeRetry:
		p.retry(ps, b, err, leaderMoved(err))
	case outcomeTooLarge, outcomePoison:
		if len(b.recs) > 1 {
			// Rejected whole, so nothing was appended and no sequence
			// used: send its records one per batch to find the culprit.
			ps.queue = append(b.recs[:len(b.recs):len(b.recs)], ps.queue...)
			ps.single = len(b.recs)
			for _, r := range b.recs {
				ps.queued += r.Size() + recordOverhead
			}
			return
		}
		p.poison(ps, b.recs[0], err)
	default:
		p.log.Error("kafka refused a batch for good: failing the partition's records",
			zap.String("topic", ps.topic.name), zap.Int32("partition", ps.partition), zap.Error(err))
		if !b.sent.IsZero() {
			// The wait for this answer was Kafka's too: a leader or
			// coordinator that was away answers late, and then with the
			// epoch its abort bumped (classifyTxnErr).
			p.noteTxnFailing(p.now().Sub(b.sent))
		}
		err = p.classifyTxnErr(err)
		p.settle(b, err)
		p.stopPartition(ps, err)
		if p.cfg.TransactionalID != "" {
			p.failTxn(err)
		}
	}
}

// retry schedules b to be sent again, unchanged, unless ps has failed for
// longer than the delivery timeout.
func (p *Producer) retry(ps *partitionState, b *batch, err error, refresh bool) {
	ps.wait(b)
	now := p.now()
	if ps.failingAt.IsZero() {
		ps.failingAt = now
	}
	ps.attempts++
	if !b.sent.IsZero() {
		p.noteTxnFailing(now.Sub(b.sent))
	}
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
