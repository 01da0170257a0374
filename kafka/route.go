package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// add routes a new record.
func (p *Producer) add(r *Record) {
	p.outstanding++
	if p.closingNow() {
		p.fail(r, closedErr(r))
		return
	}
	if p.txn.failed != nil {
		p.fail(r, &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: fmt.Errorf("%w: %w", ErrTxnFailed, p.txn.failed)})
		return
	}
	t := p.topics[r.Topic]
	if t == nil {
		t = &topicState{name: r.Topic, parts: make(map[int32]*recBuf)}
		p.topics[r.Topic] = t
	}
	switch {
	case t.failed != nil:
		p.fail(r, stoppedErr(r, t.failed))
	case t.partitions == 0:
		t.pending = append(t.pending, r)
		p.resolve(t)
	case t.nextPartitions != 0:
		// The partition count changed: records wait until the old
		// partitions drained (repartitioned, from schedule); no lookup.
		t.pending = append(t.pending, r)
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
func recordErr(r *Record, cause error) error {
	if pe := (*PoisonError)(nil); errors.As(cause, &pe) && pe.OutboxID == r.OutboxID && pe.Topic == r.Topic {
		return cause
	}
	if errors.Is(cause, ErrProducerClosed) {
		return closedErr(r)
	}
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: cause}
}

// stoppedErr is the error of r, never sent because its partition stopped.
func stoppedErr(r *Record, cause error) error {
	if errors.Is(cause, ErrProducerClosed) {
		return closedErr(r)
	}
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: errPartitionStopped}
}

func (p *Producer) route(t *topicState, r *Record) {
	part := int32(murmur2(r.Key)&0x7fffffff) % t.partitions
	rb := t.parts[part]
	if rb == nil {
		rb = &recBuf{topic: t, partition: part}
		t.parts[part] = rb
	}
	r.Partition = part
	if rb.failed != nil {
		p.fail(r, stoppedErr(r, rb.failed))
		return
	}
	if r.Size()+recordOverhead > p.cfg.MaxMessageBytes {
		err := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: sarama.ConfigurationError(fmt.Sprintf(
			"record of %d bytes is larger than the producer's max message bytes (%d)", r.Size(), p.cfg.MaxMessageBytes))}
		p.fail(r, err)
		if !p.cfg.ContinueAfterPoison {
			// What is queued ahead of it still goes; nothing behind it.
			rb.seal(err)
		}
		return
	}
	rb.push(r, p.now())
	if rb.leader == nil {
		p.resolve(t)
	}
}

func closedErr(r *Record) error {
	return &ProduceError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Err: ErrProducerClosed}
}
