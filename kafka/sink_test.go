package kafka

import (
	"testing"

	"github.com/IBM/sarama"
	"go.uber.org/zap"
)

// A sink with a request in flight takes no partition for another: at most
// one request per broker in flight (rule 1), whatever its partitions hold.
func TestScheduleSendsNothingThroughABusySink(t *testing.T) {
	p := bareProducer()
	p.log = zap.NewNop()
	p.cfg.MetadataRefresh = 0
	b := sarama.NewBroker("127.0.0.1:9")
	p.sinks = map[int32]*sink{}
	s := p.sinkFor(b.ID(), b)
	s.busy = true
	top := &topicState{name: "t", partitions: 1}
	rb := &recBuf{topic: top, leader: b}
	top.parts = map[int32]*recBuf{0: rb}
	p.topics = map[string]*topicState{"t": top}
	queued(p, rb, 1, 2)

	p.schedule()
	if rb.phase != partIdle || len(rb.queue) != 2 || len(s.ready) != 0 {
		t.Fatalf("after schedule with the broker's request in flight: partition %s, %d queued, %d partitions ready in the sink; want idle, 2 queued, none ready",
			rb.phase, len(rb.queue), len(s.ready))
	}
}
