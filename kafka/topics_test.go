package kafka

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/internal/testenv"
)

// startFakeKafkaBrokers is startFakeKafka with n brokers.
func startFakeKafkaBrokers(t *testing.T, n int, partitions int32, topics ...string) *fakeKafka {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(n), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f := &fakeKafka{c: c, log: &produceLog{}}
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.log.observe(kreq)
		return nil, nil, false // observe only; kept
	})
	return f
}

// holdResponses makes p hold every produce response for a partition of
// topic until release is closed (the broker answered; the producer has not
// read it yet); held is closed once the first is held. The connection stays
// free for other requests, such as metadata.
func holdResponses(p *Producer, topic string, part int32) (held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.testRespond = func(pr produceResponse) {
		for _, ps := range pr.parts {
			if ps.topic.name == topic && ps.partition == part {
				once.Do(func() { close(held) })
				<-release
			}
		}
	}
	return held, release
}

// The panic: a metadata refresh says the topic is unknown (it was
// deleted) while one of its partitions has a batch in flight on another
// broker. Stopping the topic must not drop that batch: its response comes
// back later, and its records come back exactly once — acknowledged when
// the broker appended them, refused (poison) when it did not.
func TestKafkaProducerTopicDeletedWithABatchInFlight(t *testing.T) {
	for _, cont := range []bool{false, true} {
		for _, refused := range []bool{false, true} {
			name := map[bool]string{false: "halt", true: "dead-letter"}[cont] + map[bool]string{false: "/acked", true: "/refused"}[refused]
			t.Run(name, func(t *testing.T) { topicDeletedInFlight(t, cont, refused) })
		}
	}
}

func topicDeletedInFlight(t *testing.T, cont, refused bool) {
	f := startFakeKafkaBrokers(t, 2, 2, "t")
	if err := f.c.MoveTopicPartition("t", 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.c.MoveTopicPartition("t", 1, 1); err != nil {
		t.Fatal(err)
	}
	if refused {
		f.c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			return failProduce(kreq, 3), nil, true // UNKNOWN_TOPIC_OR_PARTITION
		})
	}
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.ContinueAfterPoison = cont
	cfg.UnknownTopicTimeout = 100 * time.Millisecond
	p := newTestProducer(t, cfg)
	held, release := holdResponses(p, "t", 0)
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	keyP0, keyP1 := keyFor(t, 0, 2), keyFor(t, 1, 2)
	sendAll(t, p, rec(1, "t", keyP0))
	<-held
	if err := f.c.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	// Partition 1 has no leader known yet: its record makes the producer
	// look the topic up, and the answer is "unknown".
	sendAll(t, p, rec(2, "t", keyP1))
	r2 := results(t, p, 1)[0]
	if r2.OutboxID != 2 || !errors.Is(r2.Err, ErrPoison) || !errors.Is(r2.Err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("record %d: %v, want record 2 poison (unknown topic)", r2.OutboxID, r2.Err)
	}
	releaseOnce.Do(func() { close(release) })
	r1 := results(t, p, 1)[0]
	switch {
	case r1.OutboxID != 1:
		t.Fatalf("record %d came back, want record 1", r1.OutboxID)
	case !refused && r1.Err != nil:
		t.Fatalf("record 1: %v, want acknowledged (the broker appended it before the topic was deleted)", r1.Err)
	case refused && !errors.Is(r1.Err, ErrPoison):
		t.Fatalf("record 1: %v, want poison (its topic was deleted)", r1.Err)
	}
	// Later records of the topic fail at once, as poison.
	sendAll(t, p, rec(3, "t", keyP0))
	if r := results(t, p, 1)[0]; !errors.Is(r.Err, ErrPoison) && !errors.Is(r.Err, errPartitionStopped) {
		t.Fatalf("record 3: %v, want refused", r.Err)
	}
}

// A first lookup that calls a topic unknown is not the end: the topic is
// looked up again for UnknownTopicTimeout, and a topic that appears within
// it (a broker that had not caught up) takes the record.
func TestKafkaProducerUnknownTopicRetriedUntilItAppears(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.UnknownTopicTimeout = 10 * time.Second
	p := newTestProducer(t, cfg)
	var lookups atomic.Int32
	f.c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	sendAll(t, p, rec(1, "late", "a"))
	waitFor(t, func() bool { return lookups.Load() >= 2 }) // "unknown" at least once
	if err := f.c.CreateTopic("late", 1, nil); err != nil {
		t.Fatal(err)
	}
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record to a topic created after the first lookup: %v, want acknowledged", r.Err)
	}
}

// A partition count change is noticed by the periodic refresh. Records
// already routed by the old count are acknowledged before any record is
// routed by the new one: a key that moves to another partition never has a
// later event appended before an earlier one.
func TestKafkaProducerPartitionCountChangeDrainsFirst(t *testing.T) {
	f := startFakeKafkaBrokers(t, 2, 1, "t")
	var lookups atomic.Int32
	f.c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		lookups.Add(1)
		return nil, nil, false
	})
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.MetadataRefresh = 5 * time.Millisecond
	p := newTestProducer(t, cfg)
	held, release := holdResponses(p, "t", 0)
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	key := keyFor(t, 1, 2) // partition 0 of 1, partition 1 of 2
	sendAll(t, p, rec(1, "t", key))
	<-held
	req := kmsg.NewCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = "t", 2
	req.Topics = append(req.Topics, rt)
	cl := newKgoClient(t, f.c.ListenAddrs())
	if _, err := req.RequestWith(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	// The new partition on the other broker, which is free to take it.
	if err := f.c.MoveTopicPartition("t", 1, 1-f.c.LeaderFor("t", 0)); err != nil {
		t.Fatal(err)
	}
	// Two refreshes after the change: the first answer was handled.
	n := lookups.Load()
	waitFor(t, func() bool { return lookups.Load() >= n+2 })
	sendAll(t, p, rec(2, "t", key))
	n = lookups.Load()
	waitFor(t, func() bool { return lookups.Load() >= n+2 })
	if got := len(f.log.all()); got != 1 {
		t.Fatalf("%d batches sent while record 1 was unacknowledged, want 1: record 2 overtook it", got)
	}
	releaseOnce.Do(func() { close(release) })
	rs := results(t, p, 2)
	if rs[0].OutboxID != 1 || rs[1].OutboxID != 2 || rs[0].Err != nil || rs[1].Err != nil {
		t.Fatalf("results %d (%v), %d (%v): want 1 then 2, acknowledged", rs[0].OutboxID, rs[0].Err, rs[1].OutboxID, rs[1].Err)
	}
	if rs[0].Partition != 0 || rs[1].Partition != 1 {
		t.Fatalf("partitions %d, %d: want 0 (old count) then 1 (new count)", rs[0].Partition, rs[1].Partition)
	}
}

func newKgoClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// In dead-letter mode, a batch the broker answered "unknown topic" (the
// topic deleted after its metadata was known) waits to be sent again; once
// the lookups call the topic missing, that batch is poison too. Before, only
// the queue was: the waiting batch was never answered and the pipeline
// waited on it for good.
func TestKafkaProducerWaitingBatchOfAMissingTopicIsPoison(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.ContinueAfterPoison = true
	cfg.UnknownTopicTimeout = 200 * time.Millisecond
	p := newTestProducer(t, cfg)
	sendAll(t, p, rec(1, "t", "a"))
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record 1: %v", r.Err)
	}
	if err := f.c.DeleteTopic("t"); err != nil {
		t.Fatal(err)
	}
	sendAll(t, p, rec(2, "t", "a"))                                                // to the known leader: "unknown topic", then waits
	if r := results(t, p, 1)[0]; r.OutboxID != 2 || !errors.Is(r.Err, ErrPoison) { // fails after 10 s unanswered
		t.Fatalf("record %d: %v, want record 2 poison (its topic is gone)", r.OutboxID, r.Err)
	}
}

// A topic the brokers call unknown, or whose partitions have no leader yet,
// is asked again within tens of milliseconds — 10 ms doubling to 250 ms —
// for as long as UnknownTopicTimeout allows, and the wait starts short again
// once the topic appears. A topic created a moment before its first record
// is the common case (its metadata is still reaching the brokers): with the
// produce retry's backoff, growing to a second, such a record arrived
// seconds after its commit. Driven by the lookup handler with a clock of
// its own, so the waits are read, not slept.
func TestKafkaProducerLooksANewTopicUpAgainWithinTensOfMilliseconds(t *testing.T) {
	p := bareProducer()
	p.log = zap.NewNop()
	p.cfg.UnknownTopicTimeout = 30 * time.Second
	now := time.Unix(1_000_000, 0)
	p.now = func() time.Time { return now }
	top := &topicState{name: "new", parts: map[int32]*recBuf{}}
	p.topics = map[string]*topicState{"new": top}
	r := rec(1, "new", "a")
	p.outstanding++
	top.pending = []*Record{r}

	wait := func() time.Duration { return top.resolveAt.Sub(now) }
	var waits []time.Duration
	for now.Sub(time.Unix(1_000_000, 0)) < 20*time.Second { // "unknown" for 20 s
		top.resolving = true
		p.handleMeta(topicMeta{topic: "new", err: sarama.ErrUnknownTopicOrPartition})
		if top.missing != nil {
			t.Fatalf("called missing after %s, before UnknownTopicTimeout (30 s)", now.Sub(time.Unix(1_000_000, 0)))
		}
		w := wait()
		waits = append(waits, w)
		if w <= 0 || w > metaBackoffMax {
			t.Fatalf("lookup %d of an unknown topic: asked again after %s, want within (0, %s]", len(waits), w, metaBackoffMax)
		}
		now = top.resolveAt
	}
	if waits[0] > metaBackoffMin {
		t.Fatalf("first wait %s, want ≤ %s", waits[0], metaBackoffMin)
	}
	// Not hammering: at the cap, about four lookups a second.
	if n := len(waits); n > 20*int(time.Second/(metaBackoffMax*4/5))+10 {
		t.Fatalf("%d lookups in 20 s of an unknown topic, want at most about %d", n, 20*int(time.Second/metaBackoffMax))
	}
	// The topic appears, its one partition without a leader yet: the wait
	// starts short again.
	top.resolving = true
	p.handleMeta(topicMeta{topic: "new", partitions: 1, leaders: map[int32]*sarama.Broker{}})
	if w := wait(); w <= 0 || w > metaBackoffMin {
		t.Fatalf("topic appeared without a leader: asked again after %s, want within (0, %s]", w, metaBackoffMin)
	}
	for i := 0; i < 50; i++ { // an election that lasts: still bounded
		now = top.resolveAt
		top.resolving = true
		p.handleMeta(topicMeta{topic: "new", partitions: 1, leaders: map[int32]*sarama.Broker{}})
		if w := wait(); w <= 0 || w > metaBackoffMax {
			t.Fatalf("leaderless lookup %d: asked again after %s, want within (0, %s]", i+2, w, metaBackoffMax)
		}
	}
	if top.parts[0] == nil || len(top.parts[0].queue) != 1 {
		t.Fatal("the record is not queued in the topic's partition once its count is known")
	}
}

// A record to a topic that appears only after the brokers called it unknown
// N times goes with the first lookup that finds it: no lookup wasted, no
// wait after it. The fake broker answers the first N metadata requests for
// the topic before it exists and the next one after it was created, so the
// bound is counted in metadata requests, not measured in time (the time is
// logged). A lookup is up to two requests: sarama asks once more itself
// when the answer says unknown.
func TestKafkaProducerProducesToATopicWithTheLookupThatFindsIt(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	cfg := testKafkaConfig(f.c.ListenAddrs())
	cfg.UnknownTopicTimeout = time.Minute
	// The defaults, whose 50 ms to 1 s produce backoff lookups used to
	// follow: 12 unknown answers took ~2.5 s then, ~0.6 s now (logged).
	cfg.RetryBackoff, cfg.RetryBackoffMax = DefaultConfig().RetryBackoff, DefaultConfig().RetryBackoffMax
	p := newTestProducer(t, cfg)
	const n = 12
	var asked atomic.Int32
	reached, created := make(chan struct{}), make(chan struct{})
	f.c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		f.c.KeepControl()
		for _, tp := range kreq.(*kmsg.MetadataRequest).Topics {
			if tp.Topic != nil && *tp.Topic == "late" {
				if asked.Add(1) == n+1 {
					f.c.SleepControl(func() { close(reached); <-created })
				}
			}
		}
		return nil, nil, false
	})
	start := time.Now()
	sendAll(t, p, rec(1, "late", "a"))
	<-reached
	appeared := time.Now()
	if err := f.c.CreateTopic("late", 1, nil); err != nil {
		t.Fatal(err)
	}
	close(created)
	if r := results(t, p, 1)[0]; r.Err != nil {
		t.Fatalf("record to a topic created after %d lookups: %v, want acknowledged", n, r.Err)
	}
	got := asked.Load()
	t.Logf("%d metadata requests answered unknown in %s; acknowledged %s after the topic appeared, %d metadata requests in all",
		n, appeared.Sub(start).Round(time.Millisecond), time.Since(appeared).Round(time.Millisecond), got)
	if got > n+2 {
		t.Fatalf("%d metadata requests for the topic, want at most %d: the %d unknown answers and one lookup that found it", got, n+2, n)
	}
}

// A real broker: a record sent the moment its topic's CreateTopics returned
// (its metadata still reaching the broker's cache, its partitions still
// electing leaders) is acknowledged with the lookups that follow. How long
// it took is logged, not asserted: it is the broker's, on a loaded machine.
func TestKafkaProducerFirstRecordToATopicJustCreatedRealBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	k := testenv.Kafka(t)
	cfg := DefaultConfig()
	cfg.Brokers = k.Brokers
	p := newTestProducer(t, cfg)
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for i := 0; i < 3; i++ {
		topic := testenv.UniqueName("justcreated")
		if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 6, ReplicationFactor: 1}, false); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.DeleteTopic(topic) })
		created := time.Now()
		sendAll(t, p, rec(int64(i+1), topic, "a"))
		r := results(t, p, 1)[0]
		if r.Err != nil {
			t.Fatalf("first record to a topic just created: %v, want acknowledged", r.Err)
		}
		t.Logf("topic created → its first record acknowledged: %s", time.Since(created).Round(time.Millisecond))
	}
}
