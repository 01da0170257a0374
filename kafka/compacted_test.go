package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/halt"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Another deployment's open transaction on the shared checkpoint topic
// neither hides nor delays this deployment's latest committed checkpoint:
// the read goes to the high watermark without waiting at the last stable
// offset, and decides each record by its own producer's marker. A record
// of a transaction still open (here this producer's own) does not count
// until it commits.
func TestReadCompactedIsNotHeldByOthersOpenTransactions(t *testing.T) {
	f := startFakeKafka(t, 1, "cp")
	put := func(p *Producer, key, value string) {
		r := &Record{Topic: "cp", Key: []byte(key), Value: []byte(value)}
		sendAll(t, p, r)
		if r := results(t, p, 1)[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	a := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-a"))
	other := newTestProducer(t, txnConfig(f.c.ListenAddrs(), "tx-other"))
	put(a, "a", "1")
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	put(other, "other", "open") // left open: holds the last stable offset
	put(a, "a", "2")
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	put(a, "a", "3") // open too: not committed yet

	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.CheckpointReadTimeout = 5 * time.Second
	began := time.Now()
	got, err := ReadCompacted(context.Background(), cfg, "cp")
	took := time.Since(began)
	if err != nil {
		t.Fatalf("ReadCompacted with another producer's transaction open: %v", err)
	}
	if string(got["a"]) != "2" || len(got) != 1 {
		t.Fatalf("ReadCompacted = %q, want only a=2 (the latest committed; a=3 and other are open)", got)
	}
	if took > 2*time.Second {
		t.Fatalf("ReadCompacted took %s: it waited for the open transactions", took)
	}
	t.Logf("read past two open transactions in %s", took.Round(time.Millisecond))

	if err := other.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err = ReadCompacted(context.Background(), cfg, "cp")
	if err != nil {
		t.Fatal(err)
	}
	if string(got["a"]) != "3" || string(got["other"]) != "open" {
		t.Fatalf("after both commits ReadCompacted = %q, want a=3 other=open", got)
	}
}

// A read told of a barrier (a record its reader wrote just before) never
// answers from a log that does not hold it: that is the log of a leader
// replaced while it was paused, older than what was committed since. Here
// the partition's high watermark stands at the barrier's offset, as such a
// leader would answer: the read keeps asking and then fails with a
// StaleLeaderError instead of returning the older value. Once the log
// holds the barrier, the read returns what it holds.
func TestReadCompactedDoesNotAnswerFromALogWithoutItsBarrier(t *testing.T) {
	f := startFakeKafka(t, 1, "cp")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	put := func(key string, value []byte) *Record {
		r := &Record{Topic: "cp", Key: []byte(key), Value: value}
		sendAll(t, p, r)
		if r := results(t, p, 1)[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	}
	put("a", []byte("1"))
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.CheckpointReadTimeout = 300 * time.Millisecond
	next := f.c.PartitionInfo("cp", 0).HighWatermark // where the next record lands
	got, err := ReadCompacted(context.Background(), cfg, "cp", Barrier{Partition: 0, Offset: next})
	var stale *StaleLeaderError
	if !errors.As(err, &stale) {
		t.Fatalf("ReadCompacted past a barrier the log does not hold = %q, %v; want a *StaleLeaderError", got, err)
	}
	if stale.HighWatermark != next || stale.Barrier != next {
		t.Fatalf("StaleLeaderError = %+v, want high watermark and barrier %d", stale, next)
	}
	t.Logf("%v", err)

	put("a", []byte("2"))
	b := put("a/read-barrier", nil) // a tombstone, as the publisher writes
	got, err = ReadCompacted(context.Background(), cfg, "cp", Barrier{Partition: b.Partition, Offset: b.Offset})
	if err != nil {
		t.Fatalf("ReadCompacted past a barrier the log holds: %v", err)
	}
	if string(got["a"]) != "2" || len(got) != 1 {
		t.Fatalf("ReadCompacted = %q, want only a=2 (the barrier is a tombstone)", got)
	}
}

// A real broker whose log cleaner runs every 200 ms on a compacted topic
// rolled every 200 ms: once the cleaner has removed the superseded records
// and the markers of the transactions left empty, the latest committed
// value of a key — its transaction's records cleaned around it — is still
// read as committed: the cleaner keeps a transaction's marker while any of
// its records stays, which the read_uncommitted reader relies on.
func TestReadCompactedAfterTheCleanerRealBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	t.Parallel()
	srv := testenv.StartKafkaWith(t, map[string]string{
		"log.cleaner.backoff.ms":                   "200",
		"log.cleaner.min.compaction.lag.ms":        "0",
		"transaction.state.log.replication.factor": "1",
	})
	cfg := txnConfig(srv.Brokers, "tx-cp")
	cfg.CheckpointReadTimeout = 30 * time.Second
	awaitTxnCoordinator(t, srv.Brokers)
	p, err := NewProducer(cfg, zaptest.NewLogger(t), ProducerHooks{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Close()
		for range p.Results() {
		}
	}()
	const topic = "checkpoints"
	admin, err := sarama.NewClusterAdmin(srv.Brokers, (&testenv.KafkaEnv{Brokers: srv.Brokers}).Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	str := func(s string) *string { return &s }
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: map[string]*string{
		"cleanup.policy": str("compact"), "segment.ms": str("200"), "min.cleanable.dirty.ratio": str("0.01"),
		"delete.retention.ms": str("100"), "min.compaction.lag.ms": str("0"),
	}}, false); err != nil {
		t.Fatal(err)
	}
	put := func(key, value string, commit bool) {
		t.Helper()
		sendAll(t, p, &Record{Topic: topic, Key: []byte(key), Value: []byte(value)})
		if r := results(t, p, 1)[0]; r.Err != nil {
			t.Fatal(r.Err)
		}
		end := p.Commit
		if !commit {
			end = p.Abort
		}
		if err := end(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	written := 0
	for i := 1; i <= 20; i++ {
		put("a", fmt.Sprint(i), true)
		put("a", fmt.Sprint("aborted-", i), false)
		written += 4 // two records, two markers
	}
	// Other keys' transactions roll segments past a=20's until the cleaner
	// has removed records (superseded values of a, aborted ones, and the
	// markers of transactions with nothing left).
	var held int
	deadline := time.Now().Add(90 * time.Second)
	for i := 0; ; i++ {
		put(fmt.Sprint("c", i%5), fmt.Sprint(i), true)
		written += 2
		if i%20 == 19 {
			if held = countRecords(t, srv.Brokers, topic); held < written-60 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cleaner removed nothing in 90 s: %d of %d records and markers still there", held, written)
			}
		}
	}
	got, err := ReadCompacted(context.Background(), cfg, topic)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after cleaning: %d of %d records and markers left; read a=%q", held, written, got["a"])
	if string(got["a"]) != "20" {
		t.Fatalf("ReadCompacted after the cleaner: a=%q, want 20 (the last committed)", got["a"])
	}
}

// countRecords counts the records and markers a partition 0 holds.
func countRecords(t *testing.T, brokers []string, topic string) int {
	t.Helper()
	client, err := sarama.NewClient(brokers, (&testenv.KafkaEnv{Brokers: brokers}).Config())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hwm, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Leader(topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for off := int64(0); off < hwm; {
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 16 << 20, Isolation: sarama.ReadUncommitted}
		req.AddBlock(topic, 0, off, 8<<20, -1)
		resp, err := b.Fetch(req)
		if err != nil {
			t.Fatal(err)
		}
		block := resp.GetBlock(topic, 0)
		next := off
		for _, rs := range block.RecordsSet {
			if rb := rs.RecordBatch; rb != nil {
				for _, r := range rb.Records {
					if rb.FirstOffset+r.OffsetDelta >= off {
						n++
					}
				}
				next = max(next, rb.FirstOffset+int64(rb.LastOffsetDelta)+1)
			}
		}
		if next == off {
			break
		}
		off = next
	}
	return n
}

// A checkpoint topic created by hand with several partitions is refused with
// one line naming the fix, and halts rather than restarts: the read barrier
// and the checkpoint would land on different partitions, so the barrier
// would protect nothing.
func TestEnsureCompactedTopicRefusesSeveralPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	k := testenv.Kafka(t)
	cfg := DefaultConfig()
	cfg.Brokers = k.Brokers
	one := k.Topic(t, "cp1", 1)
	if err := EnsureCompactedTopic(cfg, one); err != nil {
		t.Fatalf("a one-partition checkpoint topic: %v", err)
	}
	three := k.Topic(t, "cp3", 3)
	err := EnsureCompactedTopic(cfg, three)
	if !errors.Is(err, ErrCheckpointTopic) || !halt.Is(err) {
		t.Fatalf("a 3-partition checkpoint topic: %v, want ErrCheckpointTopic (a halt)", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, "3 partitions") || !strings.Contains(msg, "--checkpoint-topic") {
		t.Fatalf("%q: want one line naming the partitions and --checkpoint-topic", msg)
	}
}

// A fetch that answers no record below the high watermark (a real broker
// did so while its cleaner swapped the segment holding the offset) is asked
// again: the read still finds the latest value. Before, the first such
// answer ended the read with an error.
func TestReadCompactedAsksAgainAfterAnEmptyFetch(t *testing.T) {
	f := startFakeKafka(t, 1, "cp")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	sendAll(t, p, &Record{Topic: "cp", Key: []byte("a"), Value: []byte("1")})
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatal(r.Err)
	}
	var fetches atomic.Int32
	f.c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if fetches.Add(1) > 3 {
			return nil, nil, false // the fourth and later: answered as they are
		}
		f.c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition, sp.HighWatermark, sp.LastStableOffset = rp.Partition, 1, 1
				sp.PreferredReadReplica, sp.RecordBatches = -1, []byte{}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.CheckpointReadTimeout = 10 * time.Second
	got, err := ReadCompacted(context.Background(), cfg, "cp")
	if err != nil {
		t.Fatalf("ReadCompacted after three empty fetches: %v", err)
	}
	if string(got["a"]) != "1" {
		t.Fatalf("ReadCompacted = %q, want a=1", got)
	}
	if n := fetches.Load(); n < 4 {
		t.Fatalf("%d fetches, want the three empty ones and more", n)
	}
}
