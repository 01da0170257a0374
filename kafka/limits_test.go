package kafka

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/internal/testenv"
)

// A produce request never exceeds the broker's
// socket.request.max.bytes, nor a batch its message.max.bytes, both read
// from the broker with DescribeConfigs. The fake broker reports 30,000 and
// 70,000 bytes; records of 10 KB go to 6 partitions at once, which without
// the cap would share one request of ~6 × 30 KB. Fails if the producer
// ignores the broker's limits or does not cap its requests.
func TestKafkaProducerRequestsFitTheBrokersLimits(t *testing.T) {
	f := startFakeKafka(t, 6, "t")
	const msgMax, reqMax = 30_000, 70_000
	f.c.ControlKey(int16(kmsg.DescribeConfigs), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		req := kreq.(*kmsg.DescribeConfigsRequest)
		resp := req.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, r := range req.Resources {
			rr := kmsg.NewDescribeConfigsResponseResource()
			rr.ResourceType, rr.ResourceName = r.ResourceType, r.ResourceName
			for name, v := range map[string]string{"message.max.bytes": "30000", "socket.request.max.bytes": "70000"} {
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Value = name, kmsg.StringPtr(v)
				rr.Configs = append(rr.Configs, c)
			}
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
	var mu sync.Mutex
	largest, requests := 0, 0
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		n := 0
		for _, t := range kreq.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				n += len(p.Records)
			}
		}
		mu.Lock()
		largest, requests = max(largest, n), requests+1
		mu.Unlock()
		return nil, nil, false
	})
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	if p.cfg.MaxMessageBytes != msgMax || p.cfg.MaxRequestBytes != reqMax {
		t.Fatalf("limits %d/%d, want the broker's %d/%d", p.cfg.MaxMessageBytes, p.cfg.MaxRequestBytes, msgMax, reqMax)
	}
	var rs []*Record
	for i := int64(1); i <= 60; i++ {
		r := rec(i, "t", keyFor(t, int32(i%6), 6))
		r.Value = []byte(strings.Repeat("v", 10_000))
		rs = append(rs, r)
	}
	if err := p.SendBatch(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	for _, r := range results(t, p, 60) {
		if r.Err != nil {
			t.Fatalf("record %d: %v", r.OutboxID, r.Err)
		}
	}
	for _, b := range f.log.all() {
		if len(b.values)*10_000 > msgMax {
			t.Fatalf("a batch of %d records of 10 KB: over message.max.bytes %d", len(b.values), msgMax)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d produce requests, the largest %d bytes of batches", requests, largest)
	if largest > reqMax {
		t.Fatalf("a produce request carried %d bytes of batches, over socket.request.max.bytes %d", largest, reqMax)
	}
}

// The real broker answers DescribeConfigs with its limits (Kafka 4.1's
// defaults on the dev stack: message.max.bytes 1048588,
// socket.request.max.bytes 104857600).
func TestKafkaBrokerLimitsFromARealBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	k := testenv.Kafka(t)
	cfg := DefaultConfig()
	cfg.Brokers = k.Brokers
	conf, err := cfg.Sarama()
	if err != nil {
		t.Fatal(err)
	}
	client, err := sarama.NewClient(k.Brokers, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	msg, req, err := brokerLimits(client, conf)
	t.Logf("message.max.bytes %d, socket.request.max.bytes %d, err %v", msg, req, err)
	if err != nil || msg <= 0 || req <= 0 {
		t.Fatalf("brokerLimits = %d, %d, %v: want both limits from the broker", msg, req, err)
	}
}

// With EncodedBytes set, the requests of all brokers hold at most that many
// encoded bytes at once: sarama encodes a request's batches twice (the
// batch's own copy and the request buffer), so one broker's request carries
// at most EncodedBytes / 2. Records of 10 KB, one per batch, to 6
// partitions of one broker would otherwise share requests of 6 batches;
// with EncodedBytes 44,000 a request carries at most 22,000 bytes, two
// batches. One batch always
// goes, whatever the limit. Fails if the producer ignores EncodedBytes.
func TestKafkaProducerRequestsHoldAtMostEncodedBytes(t *testing.T) {
	f := startFakeKafka(t, 6, "t")
	var mu sync.Mutex
	largest, requests := 0, 0
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		n := 0
		for _, t := range kreq.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				n += len(p.Records)
			}
		}
		mu.Lock()
		largest, requests = max(largest, n), requests+1
		mu.Unlock()
		return nil, nil, false
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	const encoded = 44_000
	cfg.EncodedBytes = encoded
	cfg.MaxMessageBytes = 11_000 // one record per batch
	p := newTestProducer(t, cfg)
	var rs []*Record
	for i := int64(1); i <= 60; i++ {
		r := rec(i, "t", keyFor(t, int32(i%6), 6))
		r.Value = []byte(strings.Repeat("v", 10_000))
		rs = append(rs, r)
	}
	if err := p.SendBatch(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	for _, r := range results(t, p, 60) {
		if r.Err != nil {
			t.Fatalf("record %d: %v", r.OutboxID, r.Err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d produce requests, the largest %d bytes of batches", requests, largest)
	if largest > encoded/2 {
		t.Fatalf("a produce request carried %d bytes of batches, over EncodedBytes / 2 = %d", largest, encoded/2)
	}
}

// A batch larger than a request's share of EncodedBytes still goes, alone.
func TestKafkaProducerSendsABatchLargerThanEncodedBytes(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.EncodedBytes = 1000
	p := newTestProducer(t, cfg)
	r := rec(1, "t", "a")
	r.Value = []byte(strings.Repeat("v", 10_000))
	sendAll(t, p, r)
	if got := results(t, p, 1)[0]; got.Err != nil {
		t.Fatalf("a 10 KB record with EncodedBytes 1,000: %v, want it acknowledged", got.Err)
	}
}
