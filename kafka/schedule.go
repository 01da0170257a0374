package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

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
		p.repartitioned(t)
		if t.partitions > 0 && t.failed == nil && !t.resolving && p.cfg.MetadataRefresh > 0 {
			if now.Before(t.refreshAt) {
				soon(t.refreshAt)
			} else {
				t.refreshAt = now.Add(p.cfg.MetadataRefresh)
				p.resolve(t)
			}
		}
		if !t.resolving && !t.resolveAt.IsZero() && (len(t.pending) > 0 || t.needsLeader()) {
			if now.Before(t.resolveAt) {
				soon(t.resolveAt)
			} else {
				p.resolve(t)
			}
		}
		for _, ps := range t.parts {
			if !ps.hasWork() {
				continue
			}
			if ps.leader == nil {
				p.resolve(t)
				continue
			}
			if ps.phase == partWaiting && now.Before(ps.retryAt) {
				soon(ps.retryAt)
				continue
			}
			if ps.phase == partIdle && p.cfg.Linger > 0 && ps.queued < p.cfg.MaxMessageBytes {
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
		if ps.leader == nil && ps.hasWork() {
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
	// broker's next request, their batch waiting in the queue.
	size, sent := requestOverhead, parts[:0:0]
	for _, ps := range parts {
		if len(sent) > 0 && size+p.nextBatchBytes(ps)+batchOverhead > p.cfg.MaxRequestBytes {
			continue
		}
		b := p.take(ps)
		size += b.bytes + batchOverhead
		sent = append(sent, ps)
		req.AddBatch(ps.topic.name, ps.partition, b.rb)
	}
	parts = sent
	bs.busy = true
	p.inflight++
	b := bs.b
	conf := p.conf
	p.spawn(func() {
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
	})
}

// respond hands a request's outcome to run without ever blocking the caller.
func (p *Producer) respond(pr produceResponse) {
	if hook := p.testRespond; hook != nil {
		p.spawn(func() { hook(pr); p.resp <- pr })
		return
	}
	select {
	case p.resp <- pr:
	default:
		p.spawn(func() { p.resp <- pr })
	}
}
