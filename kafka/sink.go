package kafka

import (
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// sink is one broker's side of the producer: it builds a produce request
// from the recBufs the broker leads that are ready, keeps at most one
// request in flight, and hands each partition's answer to the producer
// (acked, refused, retry). Like all the producer's state it is used on
// run's goroutine only; its request runs in a goroutine started with spawn.
type sink struct {
	p     *Producer
	b     *sarama.Broker
	busy  bool      // a request is in flight
	ready []*recBuf // the partitions its next request carries (see schedule)
	// aborting: the request in flight is being aborted (its connection
	// closed) because a batch in it reached its delivery timeout.
	aborting bool
}

// produceResponse is the outcome of one sink's request.
type produceResponse struct {
	sink   *sink
	broker *sarama.Broker
	parts  []*recBuf
	resp   *sarama.ProduceResponse
	err    error
}

// sinkFor returns the sink of broker id, made on first use with b.
func (p *Producer) sinkFor(id int32, b *sarama.Broker) *sink {
	s := p.sinks[id]
	if s == nil {
		s = &sink{p: p, b: b}
		p.sinks[id] = s
	}
	return s
}

// add puts rb, which leader leads, in s's next request.
func (s *sink) add(rb *recBuf) {
	s.b = rb.leader
	s.ready = append(s.ready, rb)
}

// produce sends one request with a batch of each ready partition.
func (s *sink) produce() {
	p := s.p
	parts := s.ready
	s.ready = nil
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
	// socket.request.max.bytes) nor its share of EncodedBytes: partitions
	// that do not fit go in the broker's next request, their batch waiting
	// in the queue.
	limit := p.requestLimit()
	size, sent := requestOverhead, parts[:0:0]
	for _, rb := range parts {
		if len(sent) > 0 && size+rb.nextBatchBytes(p.cfg.MaxMessageBytes)+batchOverhead > limit {
			continue
		}
		b := rb.take(p)
		b.via = s
		size += b.bytes + batchOverhead
		sent = append(sent, rb)
		req.AddBatch(rb.topic.name, rb.partition, b.rb)
	}
	s.busy = true
	p.inflight++
	s.send(req, sent)
}

// requestLimit is the most bytes one produce request carries:
// MaxRequestBytes, or less with EncodedBytes set, so that the requests of
// every broker, each encoded twice (see Config.EncodedBytes), hold at most
// EncodedBytes at once. A request always carries one batch, whatever the
// limit.
func (p *Producer) requestLimit() int {
	limit := p.cfg.MaxRequestBytes
	if p.cfg.EncodedBytes > 0 {
		brokers := max(len(p.client.Brokers()), len(p.sinks), 1)
		limit = min(limit, p.cfg.EncodedBytes/(2*brokers))
	}
	return limit
}

// send runs req in a goroutine and reports its outcome to run.
func (s *sink) send(req *sarama.ProduceRequest, parts []*recBuf) {
	p, b, conf := s.p, s.b, s.p.conf
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
			p.respond(produceResponse{sink: s, broker: b, parts: parts, resp: resp, err: err})
		})
		if err != nil {
			p.respond(produceResponse{sink: s, broker: b, parts: parts, err: err})
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

// handle takes s's answered request back: every partition it carried lands
// its batch, and the broker's answer for it decides what happens next.
func (s *sink) handle(pr produceResponse) {
	p := s.p
	s.busy, s.aborting = false, false
	p.inflight--
	now := p.now()
	if pr.err != nil {
		// The request or its connection failed: the batches may or may not
		// have been appended. Resending them unchanged is safe (rule 2).
		go pr.broker.Close() // not here: Close waits for the broker's lock
		for _, rb := range pr.parts {
			b, stopCause := rb.land(now)
			switch {
			case b == nil:
				p.strayResponse(rb, stopCause)
			case stopCause != nil:
				b.settle(p, stopCause)
			default:
				p.retry(rb, b, fmt.Errorf("broker %s: %w", pr.broker.Addr(), pr.err), true)
			}
		}
		p.forgetLeader(pr.broker)
		return
	}
	for _, rb := range pr.parts {
		var err error = sarama.ErrIncompleteResponse
		var block *sarama.ProduceResponseBlock
		if pr.resp != nil {
			block = pr.resp.GetBlock(rb.topic.name, rb.partition)
		}
		if block != nil {
			err = block.Err
		}
		b, stopCause := rb.land(now)
		switch {
		case b == nil:
			p.strayResponse(rb, stopCause)
		case outcome(err) == outcomeAcked:
			p.acked(rb, b, block.Offset)
		case stopCause != nil:
			b.settle(p, stopCause)
		default:
			p.refused(rb, b, err)
		}
	}
}

// abort closes s's connection when a request is in flight, so that the
// request returns (with an error): at shutdown, and when a batch in it
// reached its delivery timeout unanswered. The request's other batches are
// sent again (rule 2).
func (s *sink) abort() {
	if s.busy && !s.aborting {
		s.aborting = true
		b := s.b
		s.p.spawn(func() { b.Close() })
	}
}
