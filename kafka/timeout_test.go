package kafka

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/halt"
)

// A record's delivery timeout runs from its first attempt whether or not an
// answer or a leader ever comes (recBuf.deadline, checked by schedule).
// Before, it was checked only when a response arrived, so a partition that
// had no leader, or a request its broker never answered, held its records
// without a word.

// noLeaderMetadata answers a metadata request with the cluster's brokers
// and topic's partitions led by broker 99, which is not among them: a
// lookup that succeeds and names no usable leader, as while a broker
// registers, and like the missing partitions of a topic recreated with
// fewer (sarama's Leader fails for each; the lookup itself does not).
func noLeaderMetadata(t *testing.T, c *kfake.Cluster, kreq kmsg.Request, topic string, partitions int32) kmsg.Response {
	req := kreq.(*kmsg.MetadataRequest)
	resp := req.ResponseKind().(*kmsg.MetadataResponse)
	for i, addr := range c.ListenAddrs() {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Error(err)
		}
		n, _ := strconv.Atoi(port)
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID, b.Host, b.Port = int32(i), host, int32(n)
		resp.Brokers = append(resp.Brokers, b)
	}
	rt := kmsg.NewMetadataResponseTopic()
	name := topic
	rt.Topic = &name
	for i := int32(0); i < partitions; i++ {
		rp := kmsg.NewMetadataResponseTopicPartition()
		rp.Partition, rp.Leader, rp.LeaderEpoch = i, 99, 1
		rp.Replicas, rp.ISR = []int32{99}, []int32{99}
		rt.Partitions = append(rt.Partitions, rp)
	}
	resp.Topics = append(resp.Topics, rt)
	return resp
}

// A partition that loses its leader for good: its batch is refused "not
// leader", and every lookup after that names no usable leader. The batch
// fails at the delivery timeout from its first send — with nothing ever
// sent again there is no response to check it on — and so does every
// record behind it, unsent.
func TestKafkaProducerPartitionWithoutALeaderFailsAtTheDeliveryTimeout(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.DeliveryTimeout = 300 * time.Millisecond
	p := newTestProducer(t, cfg)
	sendAll(t, p, rec(1, "t", "a"))
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record 1: %v", r.Err)
	}
	f.c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		return noLeaderMetadata(t, f.c, kreq, "t", 1), nil, true
	})
	f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		return failProduce(kreq, 6), nil, true // NOT_LEADER_OR_FOLLOWER
	})
	sent := time.Now()
	sendAll(t, p, rec(2, "t", "a"))
	waitFor(t, func() bool { return len(f.log.all()) >= 2 }) // record 2 went out once
	sendAll(t, p, rec(3, "t", "a"))
	got := results(t, p, 2)
	sortByID(got)
	if err := got[0].Err; got[0].OutboxID != 2 || !errors.Is(err, ErrProduce) || errors.Is(err, ErrPoison) || !errors.Is(err, errNoLeader) {
		t.Fatalf("record %d: %v, want record 2 failed (a restart, not poison) for want of a leader", got[0].OutboxID, err)
	}
	if took := time.Since(sent); took < cfg.DeliveryTimeout {
		t.Fatalf("record 2 failed after %s, before its delivery timeout %s", took, cfg.DeliveryTimeout)
	}
	if err := got[1].Err; !errors.Is(err, errPartitionStopped) {
		t.Fatalf("record 3: %v, want not sent behind the failed record", err)
	}
}

// A request the broker never answers (its bytes held, no connection
// closed: a network partition) fails its batch at the delivery timeout
// from its first send, not at the connection's read timeout or whenever
// the network heals; the records behind it fail unsent, and the request
// is aborted so its broker's connection is free again.
func TestKafkaProducerUnansweredRequestFailsAtTheDeliveryTimeout(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	var held atomic.Int32
	f.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		held.Add(1)
		return nil, nil, true // handled, no answer: the client waits
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.DeliveryTimeout = 300 * time.Millisecond
	cfg.RequestTimeout = 30 * time.Second // the read timeout (35 s) is far past the test's bounds
	p := newTestProducer(t, cfg)
	sent := time.Now()
	sendAll(t, p, rec(1, "t", "a"))
	waitFor(t, func() bool { return held.Load() == 1 })
	sendAll(t, p, rec(2, "t", "a"))
	got := results(t, p, 2)
	sortByID(got)
	if err := got[0].Err; !errors.Is(err, ErrProduce) || !errors.Is(err, errNoAnswer) {
		t.Fatalf("record 1: %v, want failed at the delivery timeout for want of an answer", err)
	}
	if took := time.Since(sent); took < cfg.DeliveryTimeout {
		t.Fatalf("record 1 failed after %s, before its delivery timeout %s", took, cfg.DeliveryTimeout)
	}
	if err := got[1].Err; !errors.Is(err, errPartitionStopped) {
		t.Fatalf("record 2: %v, want not sent behind the failed record", err)
	}
	if held.Load() != 1 {
		t.Fatalf("%d produce requests reached the broker, want 1: record 2 was sent behind the unanswered one", held.Load())
	}
	// The aborted request came back: Close does not wait for the network.
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting 10 s after the delivery timeout: the unanswered request was not aborted")
	}
}

// A topic deleted and recreated with fewer partitions (6 → 3): a record of
// a partition that no longer exists fails with an error naming the topic
// and both counts — a restart, not poison — and so does every later record
// of the topic in this producer; the restart's producer routes keys by the
// new count. Before, metadata kept the old count ("partitions never
// shrink"), the partition had no leader, and its records waited for good.
func TestKafkaProducerTopicRecreatedWithFewerPartitions(t *testing.T) {
	f := startFakeKafka(t, 6, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	p := newTestProducer(t, cfg)
	key := keyFor(t, 4, 6)
	sendAll(t, p, rec(1, "t", key))
	if r := results(t, p, 1)[0]; r.Err != nil || r.Partition != 4 {
		t.Fatalf("record 1: partition %d, %v; want 4, acknowledged", r.Partition, r.Err)
	}
	if err := f.c.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	if err := f.c.CreateTopic("t", 3, nil); err != nil {
		t.Fatal(err)
	}
	sendAll(t, p, rec(2, "t", key))
	r := results(t, p, 1)[0]
	var se *PartitionsShrunkError
	if !errors.As(r.Err, &se) || !errors.Is(r.Err, ErrProduce) || errors.Is(r.Err, ErrPoison) {
		t.Fatalf("record 2: %v, want a produce error (a restart, not poison) saying the partitions shrank", r.Err)
	}
	if se.Topic != "t" || se.From != 6 || se.To != 3 || !strings.Contains(r.Err.Error(), `"t"`) ||
		!strings.Contains(r.Err.Error(), "6") || !strings.Contains(r.Err.Error(), "3") {
		t.Fatalf("record 2: %v (%+v), want topic t, 6 → 3 named", r.Err, se)
	}
	sendAll(t, p, rec(3, "t", keyFor(t, 1, 6)))
	if r := results(t, p, 1)[0]; !errors.Is(r.Err, ErrProduce) {
		t.Fatalf("record 3: %v, want failed: nothing later of the topic goes in this producer", r.Err)
	}
	// The pipeline's restart: a new producer routes by the new count.
	p2 := newTestProducer(t, cfg)
	sendAll(t, p2, rec(2, "t", key))
	r = results(t, p2, 1)[0]
	if want := int32(murmur2([]byte(key))&0x7fffffff) % 3; r.Err != nil || r.Partition != want {
		t.Fatalf("record 2 after the restart: partition %d, %v; want %d (murmur2 %% 3), acknowledged", r.Partition, r.Err, want)
	}
}

// INVALID_TIMESTAMP is a clock or a broker setting, not the event: the
// batch fails for good with an error that halts and names the settings —
// not poison, so not dead-lettered either — and the records behind it fail
// unsent (rule 3). Before, it was poison: dead-lettered, one event after
// another, or a halt that told the operator to set a dead-letter topic.
func TestKafkaProducerInvalidTimestampHaltsNamingTheBrokerSettings(t *testing.T) {
	for _, cont := range []bool{false, true} {
		t.Run(map[bool]string{false: "halt", true: "dead-letter"}[cont], func(t *testing.T) {
			f := startFakeKafka(t, 1, "t")
			f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				return failProduce(kreq, 32), nil, true // INVALID_TIMESTAMP, once
			})
			cfg := testKafkaConfig(f.c.ListenAddrs())
			cfg.ContinueAfterPoison = cont
			p := newTestProducer(t, cfg)
			old := rec(1, "t", "a")
			old.Timestamp = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
			sendAll(t, p, old)
			waitFor(t, func() bool { return len(f.log.all()) > 0 })
			sendAll(t, p, rec(2, "t", "a"))
			got := results(t, p, 2)
			sortByID(got)
			err := got[0].Err
			var te *TimestampError
			if !errors.As(err, &te) || !halt.Is(err) || errors.Is(err, ErrPoison) {
				t.Fatalf("record 1: %v, want a timestamp error that halts, not poison", err)
			}
			for _, want := range []string{"message.timestamp.before.max.ms", "message.timestamp.after.max.ms", "2020-01-02T03:04:05Z", `"t"`} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("record 1: %v, want it to name %s", err, want)
				}
			}
			if !errors.Is(got[1].Err, errPartitionStopped) {
				t.Fatalf("record 2: %v, want not sent behind the refused record", got[1].Err)
			}
		})
	}
}
