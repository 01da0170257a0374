package kafka

import (
	"time"
)

// schedule fails the records past their delivery timeout, sends one
// request to every idle broker that leads a partition with something to
// send, and returns when it next needs to run (zero: no timer).
func (p *Producer) schedule() time.Time {
	now := p.now()
	var wake time.Time
	soon := func(t time.Time) {
		if !t.IsZero() && (wake.IsZero() || t.Before(wake)) {
			wake = t
		}
	}
	var ready []*sink
	needAdd := map[topicPartition]bool{}
	for _, t := range p.topics {
		p.repartitioned(t)
		soon(p.refreshMeta(t, now))
		for _, rb := range t.parts {
			// Before anything else: a record past its delivery timeout
			// fails here whether or not an answer or a leader ever comes.
			soon(p.expireDue(rb, now))
			if !rb.hasWork() {
				continue
			}
			if rb.leader == nil {
				p.resolve(t)
				continue
			}
			if ok, at := rb.due(now, p.cfg.Linger, p.cfg.MaxMessageBytes); !ok {
				soon(at)
				continue
			}
			if !p.txnPartitionReady(rb, needAdd) {
				continue
			}
			s := p.sinkFor(rb.leader.ID(), rb.leader)
			if s.busy {
				continue
			}
			if len(s.ready) == 0 {
				ready = append(ready, s)
			}
			s.add(rb)
		}
	}
	p.startAdd(needAdd)
	for _, s := range ready {
		s.produce()
	}
	return wake
}

// refreshMeta looks t up when its metadata is due: the periodic refresh
// that notices a new partition count, or the retry of a failed lookup
// while records wait for it. It returns when t is due next (zero: none).
func (p *Producer) refreshMeta(t *topicState, now time.Time) time.Time {
	var next time.Time
	if t.partitions > 0 && t.failed == nil && !t.resolving && p.cfg.MetadataRefresh > 0 {
		if now.Before(t.refreshAt) {
			next = t.refreshAt
		} else {
			t.refreshAt = now.Add(p.cfg.MetadataRefresh)
			p.resolve(t)
		}
	}
	if !t.resolving && !t.resolveAt.IsZero() && (len(t.pending) > 0 || t.needsLeader()) {
		if now.Before(t.resolveAt) {
			if next.IsZero() || t.resolveAt.Before(next) {
				next = t.resolveAt
			}
		} else {
			p.resolve(t)
		}
	}
	return next
}

func (t *topicState) needsLeader() bool {
	for _, rb := range t.parts {
		if rb.leader == nil && rb.hasWork() {
			return true
		}
	}
	return false
}
