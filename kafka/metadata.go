package kafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/backoff"
)

// resolve starts a metadata refresh for t unless one runs or is backing off.
func (p *Producer) resolve(t *topicState) {
	if t.resolving || p.now().Before(t.resolveAt) {
		return
	}
	t.resolving = true
	client := p.client
	topic := t.name
	p.spawn(func() {
		m := topicMeta{topic: topic}
		m.err = client.RefreshMetadata(topic)
		if m.err == nil || errors.Is(m.err, sarama.ErrLeaderNotAvailable) {
			// A topic whose partitions have no leader yet (just created,
			// or an election) is known: its partitions are stored, and
			// those without a leader are asked again soon (handleMeta).
			// Leaders come from the lookup just made: client.Leader would
			// look a leaderless partition up again on its own, one
			// partition after another, each with sarama's retry.
			var ids []int32
			if ids, m.err = client.Partitions(topic); m.err == nil {
				m.partitions = int32(len(ids))
				m.leaders = make(map[int32]*sarama.Broker, len(ids))
				writable, _ := client.WritablePartitions(topic)
				for _, id := range writable {
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
	})
}

func (p *Producer) handleMeta(m topicMeta) {
	t := p.topics[m.topic]
	t.resolving = false
	now := p.now()
	if m.err != nil || m.partitions == 0 {
		p.lookupFailed(t, m.err, now)
		return
	}
	if !t.unknownSince.IsZero() {
		t.attempts = 0 // the topic appeared: a wait for its leaders starts short
	}
	t.failingAt, t.unknownSince, t.missing = time.Time{}, time.Time{}, nil
	t.refreshAt = now.Add(p.cfg.MetadataRefresh)
	if t.partitions != 0 && m.partitions < t.partitions {
		p.shrunk(t, m.partitions)
		return
	}
	if t.partitions == 0 {
		t.partitions = m.partitions
	} else if m.partitions != t.partitions && m.partitions != t.nextPartitions {
		p.log.Warn("kafka topic partition count changed: new records wait until every record already routed by the old count is acknowledged, then keys move to their new partitions (per-key order kept)",
			zap.String("topic", t.name), zap.Int32("from", t.partitions), zap.Int32("to", m.partitions))
		t.nextPartitions = m.partitions
	}
	for id, rb := range t.parts {
		rb.leader = m.leaders[id]
	}
	t.leaders = m.leaders
	// Set before routing: a record routed to a partition without a leader
	// asks for a lookup, and the one just answered must not be asked again
	// at once.
	t.resolveAt = now.Add(p.metaBackoff(t.attempts + 1))
	if t.nextPartitions == 0 {
		p.routePending(t)
	}
	for _, rb := range t.parts {
		if rb.leader == nil && rb.hasWork() {
			// No leader yet (a new topic, an election): ask again soon,
			// backing off while it lasts.
			t.attempts++
			return
		}
	}
	// The topic is there and led: the next wait starts short.
	t.attempts, t.resolveAt = 0, time.Time{}
}

// lookupFailed handles a lookup of t that failed with err (nil: it found
// no partitions): an unknown topic is looked up again until it is missing;
// other failures are retried with backoff until DeliveryTimeout, then
// every record of t fails.
func (p *Producer) lookupFailed(t *topicState, err error, now time.Time) {
	if err == nil {
		err = sarama.ErrUnknownTopicOrPartition
	}
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) || errors.Is(err, sarama.ErrInvalidTopic) {
		p.unknownTopic(t, err, now)
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
		for _, rb := range t.parts {
			rb.stop(p, t.failed)
		}
		return
	}
	// A cluster that fails to answer (brokers down, a timeout) is asked
	// again as a produce is: backing off to RetryBackoffMax.
	t.resolveAt = now.Add(p.retryBackoff(t.attempts))
	if t.attempts == 1 || t.attempts%10 == 0 {
		p.log.Warn("kafka metadata unavailable; retrying", zap.String("topic", t.name),
			zap.Int("attempt", t.attempts), zap.Error(err))
	}
}

// shrunk fails every record of t, whose partition count went down to n.
// Kafka never removes partitions: the topic was deleted and recreated with
// fewer. Keys then belong to other partitions (murmur2 % n), and some of
// t's partitions are gone, so their records would never have a leader.
// Routing the later records by the new count in this producer would send a
// key's later records before its earlier ones that failed, so nothing more
// of t goes: its queued and waiting records fail with the cause, a batch in
// flight is decided by its answer, and later records fail at once (rule
// 3). The pipeline restarts; the new producer looks t up afresh and routes
// by n.
func (p *Producer) shrunk(t *topicState, n int32) {
	err := &PartitionsShrunkError{Topic: t.name, From: t.partitions, To: n}
	p.log.Error("kafka topic has fewer partitions than before (deleted and recreated): failing its records; the pipeline restarts and routes keys by the new count",
		zap.String("topic", t.name), zap.Int32("from", t.partitions), zap.Int32("to", n))
	t.failed = err
	for _, r := range t.pending {
		p.fail(r, recordErr(r, err))
	}
	t.pending = nil
	for _, rb := range t.parts {
		for _, r := range rb.unwait() {
			p.fail(r, recordErr(r, err))
		}
		for _, r := range rb.takeQueue() {
			p.fail(r, recordErr(r, err))
		}
		rb.stop(p, err)
	}
	if p.cfg.TransactionalID != "" {
		p.failTxn(err)
	}
}

// routePending routes the records that waited for t's partition count.
func (p *Producer) routePending(t *topicState) {
	pending := t.pending
	t.pending = nil
	for _, r := range pending {
		p.route(t, r)
	}
}

// repartitioned switches t to its new partition count once nothing routed
// by the old count is left in a partition: only then may a key's records go
// to another partition without overtaking its earlier ones.
func (p *Producer) repartitioned(t *topicState) {
	if t.nextPartitions == 0 {
		return
	}
	for _, rb := range t.parts {
		if !rb.drained() {
			return
		}
	}
	p.log.Info("kafka topic drained: routing by its new partition count",
		zap.String("topic", t.name), zap.Int32("from", t.partitions), zap.Int32("to", t.nextPartitions))
	t.partitions, t.nextPartitions = t.nextPartitions, 0
	for id, rb := range t.parts {
		rb.leader = t.leaders[id]
	}
	p.routePending(t)
}

// unknownTopic handles a lookup that calls t unknown. Lookups can say so
// for a moment during leader changes and broker restarts, so t is looked up
// again for UnknownTopicTimeout; after that it is missing (deleted, or never
// created) and its records are poison: together with everything behind
// them when the pipeline halts on poison, alone when it dead-letters them
// (then every new record looks t up again, so a recreated topic is used
// again at once).
func (p *Producer) unknownTopic(t *topicState, err error, now time.Time) {
	if t.unknownSince.IsZero() {
		t.unknownSince = now
	}
	if now.Sub(t.unknownSince) < p.cfg.UnknownTopicTimeout {
		t.attempts++
		t.resolveAt = now.Add(p.metaBackoff(t.attempts))
		if t.attempts == 1 || t.attempts%10 == 0 {
			p.log.Warn("kafka says the topic is unknown; looking it up again before its records are poison",
				zap.String("topic", t.name), zap.Duration("unknown_for", now.Sub(t.unknownSince)),
				zap.Duration("unknown_topic_timeout", p.cfg.UnknownTopicTimeout), zap.Error(err))
		}
		return
	}
	if t.missing == nil {
		p.log.Error("kafka topic missing: its records are poison", zap.String("topic", t.name),
			zap.Duration("unknown_for", now.Sub(t.unknownSince)), zap.Error(err))
	}
	t.missing = fmt.Errorf("topic still unknown to the brokers after %s of lookups (deleted or never created; see --kafka-unknown-topic-timeout): %w", p.cfg.UnknownTopicTimeout, err)
	t.resolveAt = time.Time{}
	pending := t.pending
	t.pending = nil
	for _, r := range pending {
		perr := &PoisonError{OutboxID: r.OutboxID, EventID: r.EventID, Topic: r.Topic, Size: r.Size(), Err: t.missing}
		p.fail(r, perr)
		if !p.cfg.ContinueAfterPoison && t.failed == nil {
			t.failed = perr
		}
	}
	for _, rb := range t.parts {
		// A batch waiting to be sent again (a produce answered "unknown
		// topic" before the lookups called it missing) is poison too:
		// nothing else would ever answer its records.
		for _, r := range rb.unwait() {
			rb.poison(p, r, t.missing)
		}
		// Queued records were never sent: each is poison itself.
		for _, r := range rb.takeQueue() {
			rb.poison(p, r, t.missing)
		}
	}
	if !p.cfg.ContinueAfterPoison {
		if t.failed == nil {
			t.failed = &PoisonError{Topic: t.name, Err: t.missing}
		}
		for _, rb := range t.parts {
			rb.stop(p, t.failed) // a batch in flight is settled by its response
		}
	}
}

// metaBackoffMin and metaBackoffMax bound the wait before a topic that the
// brokers call unknown, or whose partitions have no leader yet, is looked up
// again. Such a topic is usually one created a moment ago (by
// infrastructure code, auto-creation, a new event type) whose metadata is
// still reaching the brokers, and its first record — with every later one
// of its partition behind it — waits for the lookup that finds it: a
// backoff growing to RetryBackoffMax (1 s) made that record arrive 6.4 s
// after its commit for a topic created 0.1 s before it. At the cap a
// topic that truly does not exist costs about four lookups a second until
// UnknownTopicTimeout calls it missing.
const (
	metaBackoffMin = 10 * time.Millisecond
	metaBackoffMax = 250 * time.Millisecond
)

// metaBackoff grows from metaBackoffMin to metaBackoffMax (or from
// RetryBackoff to RetryBackoffMax when those are shorter), with jitter;
// attempt restarts from 1 once a lookup finds the topic (handleMeta).
func (p *Producer) metaBackoff(attempt int) time.Duration {
	lo, hi := p.metaBackoffBounds()
	return backoff.Jitter(backoff.Exponential(lo, hi, attempt))
}

func (p *Producer) metaBackoffBounds() (lo, hi time.Duration) {
	return min(p.cfg.RetryBackoff, metaBackoffMin), min(p.cfg.RetryBackoffMax, metaBackoffMax)
}

// retryBackoff grows from RetryBackoff to RetryBackoffMax, with jitter.
func (p *Producer) retryBackoff(attempt int) time.Duration {
	return backoff.Jitter(backoff.Exponential(p.cfg.RetryBackoff, p.cfg.RetryBackoffMax, attempt))
}
