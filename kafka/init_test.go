package kafka

import (
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A broker that has just started answers InitProducerId with
// COORDINATOR_LOAD_IN_PROGRESS until it holds a block of producer ids (a
// fresh-stack test run met it): the idempotent producer asks again instead
// of failing to start.
func TestKafkaProducerInitRetriesCoordinatorLoadInProgress(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	var refused atomic.Int32
	f.c.ControlKey(int16(kmsg.InitProducerID), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if refused.Load() == 2 {
			return nil, nil, false
		}
		f.c.KeepControl()
		refused.Add(1)
		resp := kreq.(*kmsg.InitProducerIDRequest).ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = 14 // COORDINATOR_LOAD_IN_PROGRESS
		return resp, nil, true
	})
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	sendAll(t, p, rec(1, "t", "a"))
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record after a retried InitProducerId: %v", r.Err)
	}
	if n := refused.Load(); n != 2 {
		t.Fatalf("InitProducerId was refused %d times, want 2", n)
	}
}
