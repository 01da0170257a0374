package kafka

import (
	"cmp"
	"context"
	"encoding/binary"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"
)

// These tests run Producer against kfake, an in-process Kafka that
// speaks the wire protocol and checks idempotent sequence numbers, and
// inject faults into its produce path. The real-broker proofs are the
// end-to-end tests in cmd/outboxd.

// sentBatch is one partition's batch as a produce request carried it.
type sentBatch struct {
	topic     string
	partition int32
	pid       int64
	epoch     int16
	firstSeq  int32
	values    []string
}

// produceLog records every batch the fake broker received, in order.
type produceLog struct {
	mu       sync.Mutex
	batches  []sentBatch
	requests int
}

func (l *produceLog) observe(kreq kmsg.Request) {
	req := kreq.(*kmsg.ProduceRequest)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			var rb kmsg.RecordBatch
			if err := rb.ReadFrom(p.Records); err != nil {
				panic(err)
			}
			l.batches = append(l.batches, sentBatch{
				topic: t.Topic, partition: p.Partition, pid: rb.ProducerID, epoch: rb.ProducerEpoch,
				firstSeq: rb.FirstSequence, values: recordValues(rb.Records, int(rb.NumRecords)),
			})
		}
	}
}

func (l *produceLog) all() []sentBatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sentBatch(nil), l.batches...)
}

// recordValues reads the values of n uncompressed records.
func recordValues(b []byte, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		length, k := binary.Varint(b)
		rec := b[k : k+int(length)]
		b = b[k+int(length):]
		rec = rec[1:]             // attributes
		_, k = binary.Varint(rec) // timestamp delta
		rec = rec[k:]
		_, k = binary.Varint(rec) // offset delta
		rec = rec[k:]
		kl, k := binary.Varint(rec)
		rec = rec[k:]
		if kl > 0 {
			rec = rec[kl:]
		}
		vl, k := binary.Varint(rec)
		rec = rec[k:]
		if vl < 0 { // null: a tombstone
			out = append(out, "")
			continue
		}
		out = append(out, string(rec[:vl]))
	}
	return out
}

// failProduce answers a produce request with code for every partition.
func failProduce(kreq kmsg.Request, code int16) kmsg.Response {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, t := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.ErrorCode = code
			rp.BaseOffset = -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

type fakeKafka struct {
	c   *kfake.Cluster
	log *produceLog
}

func startFakeKafka(t *testing.T, partitions int32, topics ...string) *fakeKafka {
	t.Helper()
	return startFakeKafkaBrokers(t, 1, partitions, topics...)
}

func testKafkaConfig(brokers []string) Config {
	c := DefaultConfig()
	c.Brokers = brokers
	c.RetryBackoff = 2 * time.Millisecond
	c.RetryBackoffMax = 10 * time.Millisecond
	c.DeliveryTimeout = 5 * time.Second
	c.RequestTimeout = 2 * time.Second
	c.UnknownTopicTimeout = 200 * time.Millisecond
	c.TransactionTimeout = time.Minute
	return c
}

func newTestProducer(t *testing.T, cfg Config) *Producer {
	t.Helper()
	p, err := NewProducer(cfg, zaptest.NewLogger(t), ProducerHooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		for range p.Results() {
		}
	})
	return p
}

// rec is a record whose value is its id, keyed so it lands in partition 0
// of a 1-partition topic (or wherever key puts it).
func rec(id int64, topic, key string) *Record {
	r := &Record{Topic: topic, Key: []byte(key), Value: []byte(strconv.FormatInt(id, 10)), OutboxID: id,
		Headers: []Header{{Key: "outbox-id", Value: []byte(strconv.FormatInt(id, 10))}}}
	return r
}

func sendAll(t *testing.T, p *Producer, rs ...*Record) {
	t.Helper()
	for _, r := range rs {
		if err := p.Send(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
}

func results(t *testing.T, p *Producer, n int) []*Record {
	t.Helper()
	var out []*Record
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case r, ok := <-p.Results():
			if !ok {
				t.Fatalf("results closed after %d of %d", len(out), n)
			}
			out = append(out, r)
		case <-timeout:
			t.Fatalf("%d of %d results", len(out), n)
		}
	}
	return out
}

func sortByID(rs []*Record) {
	slices.SortFunc(rs, func(a, b *Record) int { return cmp.Compare(a.OutboxID, b.OutboxID) })
}

// keyFor finds a key the Java partitioner puts in partition of n.
func keyFor(t *testing.T, partition, n int32) string {
	for i := 0; i < 1000; i++ {
		k := "k" + strconv.Itoa(i)
		if int32(murmur2([]byte(k))&0x7fffffff)%n == partition {
			return k
		}
	}
	t.Fatal("no key found")
	return ""
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// readCommitted reads every committed record of topic (read_committed) with
// franz-go's client, as a consumer would.
//
// kfake sometimes holds a client's first Fetch for its whole max wait although
// the partition holds committed records below its last stable offset (seen
// under load, ~1 in 600 runs: the Fetch at offset 0 stayed unanswered for 3 s
// while a second reader right after read every record). A short max wait makes
// such a fetch return empty and be sent again, so the reader's deadline
// measures the producer, not that hold.
func readCommitted(t *testing.T, brokers []string, topic string, want int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(kfakeFetchMaxWait))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), readCommittedWindow(want))
	defer cancel()
	for len(got) < want || want == 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// kfakeFetchMaxWait bounds how long kfake may hold one Fetch; see readCommitted.
const kfakeFetchMaxWait = 100 * time.Millisecond

// readCommittedWindow is how long readCommitted reads: until want records
// arrived, at most 15 s; when it expects none (want == 0) it reads 3 s, the
// window in which a record that should not be there would show up.
func readCommittedWindow(want int) time.Duration {
	if want == 0 {
		return 3 * time.Second
	}
	return 15 * time.Second
}
