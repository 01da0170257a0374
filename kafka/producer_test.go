package kafka

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"
)

// The rules of producer.go's doc comment, each tested against kfake (see
// fakekafka_test.go for the fake and its helpers).

// Rule 2: a retriable error resends the same batch — same producer id, epoch
// and first sequence — and the partition's records come back acknowledged
// in order at consecutive offsets, none appended twice.
func TestKafkaProducerResendsTheSameBatchOnRetriableErrors(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	failures := 0
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if failures == 3 {
			return nil, nil, false
		}
		f.c.KeepControl()
		failures++
		codes := []int16{6, 19, 7} // NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT
		return failProduce(kreq, codes[failures-1]), nil, true
	})
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	var rs []*Record
	for i := int64(1); i <= 50; i++ {
		rs = append(rs, rec(i, "t", "a"))
	}
	sendAll(t, p, rs...)
	got := results(t, p, 50)
	for i, r := range got {
		if r.Err != nil {
			t.Fatalf("record %d failed: %v", r.OutboxID, r.Err)
		}
		if r.OutboxID != int64(i+1) || r.Offset != int64(i) {
			t.Fatalf("result %d: outbox id %d at offset %d, want id %d at offset %d", i, r.OutboxID, r.Offset, i+1, i)
		}
	}
	bs := f.log.all()
	if len(bs) < 4 {
		t.Fatalf("%d batches sent, want ≥ 4 (3 failures and a success)", len(bs))
	}
	for i := 1; i <= 3; i++ {
		a, b := bs[0], bs[i]
		if a.pid != b.pid || a.epoch != b.epoch || a.firstSeq != b.firstSeq || fmt.Sprint(a.values) != fmt.Sprint(b.values) {
			t.Fatalf("attempt %d sent %+v, want the first batch %+v unchanged", i+1, b, a)
		}
	}
}

// Rule 3: when a batch fails for good, the records behind it in its
// partition fail without ever being sent, while other partitions carry on.
func TestKafkaProducerFailedBatchStopsItsPartitionUnsent(t *testing.T) {
	f := startFakeKafka(t, 2, "t")
	keyP0, keyP1 := keyFor(t, 0, 2), keyFor(t, 1, 2)
	// Partition 0 keeps failing with a retriable error until the delivery
	// timeout; partition 1 is healthy.
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		for _, tp := range req.Topics {
			for _, pp := range tp.Partitions {
				if pp.Partition == 0 {
					return failProduce(kreq, 6), nil, true
				}
			}
		}
		return nil, nil, false
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	// Long enough for the refusals to be answered on a loaded machine: at
	// 200 ms, at a load of 30, not even the first answer came back, and
	// the error named no refusal.
	cfg.DeliveryTimeout = 2 * time.Second
	p := newTestProducer(t, cfg)
	first := rec(1, "t", keyP0)
	sendAll(t, p, first)
	// Wait until the first batch is out, so the next records queue behind it.
	waitFor(t, func() bool { return len(f.log.all()) > 0 })
	sendAll(t, p, rec(2, "t", keyP0), rec(3, "t", keyP1), rec(4, "t", keyP0))
	got := map[int64]*Record{}
	for _, r := range results(t, p, 4) {
		got[r.OutboxID] = r
	}
	if err := got[1].Err; !errors.Is(err, ErrProduce) || !errors.Is(err, sarama.ErrNotLeaderForPartition) {
		t.Fatalf("record 1: %v, want a produce error after the delivery timeout", err)
	}
	for _, id := range []int64{2, 4} {
		if err := got[id].Err; !errors.Is(err, errPartitionStopped) {
			t.Fatalf("record %d: %v, want not sent behind the failed record", id, err)
		}
	}
	if got[3].Err != nil {
		t.Fatalf("record 3 in the healthy partition failed: %v", got[3].Err)
	}
	for _, b := range f.log.all() {
		for _, v := range b.values {
			if b.partition == 0 && v != "1" {
				t.Fatalf("record %s was sent to partition 0 behind a failing record", v)
			}
		}
	}
	// Records sent to the stopped partition later fail at once, unsent.
	sendAll(t, p, rec(5, "t", keyP0))
	if r := results(t, p, 1)[0]; !errors.Is(r.Err, errPartitionStopped) {
		t.Fatalf("record 5: %v, want not sent", r.Err)
	}
}

// Rule 4: without a dead-letter topic, a poison record stops its partition
// (the pipeline halts on it); with one, it fails alone.
func TestKafkaProducerPoisonRecord(t *testing.T) {
	for _, cont := range []bool{false, true} {
		t.Run(fmt.Sprintf("ContinueAfterPoison=%v", cont), func(t *testing.T) {
			f := startFakeKafka(t, 1, "t")
			cfg := testKafkaConfig(f.c.ListenAddrs())
			cfg.MaxMessageBytes = 1000
			cfg.ContinueAfterPoison = cont
			p := newTestProducer(t, cfg)
			big := rec(2, "t", "a")
			big.Value = make([]byte, 2000)
			sendAll(t, p, rec(1, "t", "a"), big, rec(3, "t", "a"))
			got := results(t, p, 3)
			sortByID(got)
			if got[0].Err != nil {
				t.Fatalf("record 1: %v", got[0].Err)
			}
			if !errors.Is(got[1].Err, ErrPoison) || got[1].OutboxID != 2 {
				t.Fatalf("record %d: %v, want poison", got[1].OutboxID, got[1].Err)
			}
			if cont && got[2].Err != nil {
				t.Fatalf("record 3 after diverted poison: %v", got[2].Err)
			}
			if !cont && !errors.Is(got[2].Err, errPartitionStopped) {
				t.Fatalf("record 3 behind poison: %v, want not sent", got[2].Err)
			}
		})
	}
}

// A batch the broker refuses as too large is split to find the culprit;
// the others are acknowledged in order.
func TestKafkaProducerSplitsABatchTheBrokerRefusesAsTooLarge(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		for _, tp := range req.Topics {
			for _, pp := range tp.Partitions {
				var rb kmsg.RecordBatch
				_ = rb.ReadFrom(pp.Records)
				for _, v := range recordValues(rb.Records, int(rb.NumRecords)) {
					if v == "3" {
						return failProduce(kreq, 10), nil, true // MESSAGE_TOO_LARGE
					}
				}
			}
		}
		return nil, nil, false
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.ContinueAfterPoison = true
	cfg.Linger = 50 * time.Millisecond // one batch of all five
	p := newTestProducer(t, cfg)
	for i := int64(1); i <= 5; i++ {
		sendAll(t, p, rec(i, "t", "a"))
	}
	got := results(t, p, 5)
	for i, r := range got {
		if r.OutboxID != int64(i+1) {
			t.Fatalf("result %d is outbox id %d: out of order", i, r.OutboxID)
		}
		if (r.OutboxID == 3) != errors.Is(r.Err, ErrPoison) || (r.OutboxID != 3 && r.Err != nil) {
			t.Fatalf("record %d: %v", r.OutboxID, r.Err)
		}
	}
}

func TestKafkaProducerUnknownTopicIsPoison(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	sendAll(t, p, rec(1, "nope", "a"))
	if r := results(t, p, 1)[0]; !errors.Is(r.Err, ErrPoison) || !errors.Is(r.Err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("record to a missing topic: %v, want poison (unknown topic)", r.Err)
	}
}

// Close fails what was not sent and closes Results once every record came
// back: the session's drain never waits forever.
func TestKafkaProducerCloseReturnsEveryRecord(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	// The broker never answers produce requests: a black hole.
	f.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		return nil, nil, true
	})
	p, err := NewProducer(testKafkaConfig(f.c.ListenAddrs()), zaptest.NewLogger(t), ProducerHooks{})
	if err != nil {
		t.Fatal(err)
	}
	sendAll(t, p, rec(1, "t", "a"))
	waitFor(t, func() bool { return len(f.log.all()) > 0 })
	sendAll(t, p, rec(2, "t", "a"))
	if err := p.SendBatch(context.Background(), []*Record{rec(3, "t", "a"), rec(4, "t", "a")}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	n := 0
	timeout := time.After(5 * time.Second)
	for {
		select {
		case r, ok := <-p.Results():
			if !ok {
				if n != 4 {
					t.Fatalf("%d results before Results closed, want 4 (two sent, two sent as a batch)", n)
				}
				return
			}
			if r.Err == nil {
				t.Fatalf("record %d acknowledged by a broker that never answered", r.OutboxID)
			}
			n++
		case <-timeout:
			t.Fatal("Results not closed after Close with a request in flight")
		}
	}
}

// Records handed over together with SendBatch share one request, one batch
// per partition, instead of the first going alone and the rest a round
// trip later.
func TestKafkaProducerSendBatchSharesARequest(t *testing.T) {
	f := startFakeKafka(t, 3, "t")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	var rs []*Record
	for i := int64(1); i <= 9; i++ {
		rs = append(rs, rec(i, "t", keyFor(t, int32(i%3), 3)))
	}
	if err := p.SendBatch(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	for _, r := range results(t, p, 9) {
		if r.Err != nil {
			t.Fatalf("record %d: %v", r.OutboxID, r.Err)
		}
	}
	f.log.mu.Lock()
	defer f.log.mu.Unlock()
	if f.log.requests != 1 || len(f.log.batches) != 3 {
		t.Fatalf("%d produce requests with %d batches, want 1 request with one batch per partition (3)", f.log.requests, len(f.log.batches))
	}
}

// Send and SendBatch never wait with no way out: after Close they refuse
// with ErrProducerClosed, and a cancelled context ends them.
func TestProducerSendEndsOnCloseAndOnContext(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// A cancelled context: the input may have room, so either outcome of
	// the select is allowed once; a full input must end on ctx.
	for range cap(p.inBatch) + 1 {
		if err := p.SendBatch(ctx, []*Record{rec(1, "t", "a")}); err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("SendBatch with a cancelled context = %v, want context.Canceled", err)
			}
			break
		}
	}
	p.Close()
	if err := p.Send(context.Background(), rec(2, "t", "a")); !errors.Is(err, ErrProducerClosed) {
		t.Fatalf("Send after Close = %v, want ErrProducerClosed", err)
	}
	if err := p.SendBatch(context.Background(), []*Record{rec(3, "t", "a")}); !errors.Is(err, ErrProducerClosed) {
		t.Fatalf("SendBatch after Close = %v, want ErrProducerClosed", err)
	}
}
