package cluster

// TestSharedCluster's topic cases (sharedcluster_test.go runs them): a
// deployment's topic deleted under load, without and with a dead-letter
// topic, and the recorder of the outbox ids a topic holds.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// A deployment's topic (6 partitions, 3 replicas) deleted under ~200
// events/s, without a dead-letter topic: no panic; the records the brokers
// no longer take are looked up again for --kafka-unknown-topic-timeout (3 s
// here), then outboxd halts naming the topic and the flag, confirming
// nothing it did not deliver. The topic is created again and outboxd
// restarted: every row is in the old topic (read before the delete) or the
// new one, the new one in per-key order.
func topicDeletedUnderLoad(t *testing.T, c *testenv.KafkaCluster) {
	began := time.Now()
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: c.Brokers(), Topic: c.CreateTopic(t, "deleted", 6), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	args := []string{"--kafka-unknown-topic-timeout", "3s"}
	d := e.Start(args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 200)
	old := recordIDs(t, c.Brokers(), e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) >= 600 })
	deletedAt := deleteWhileFrozen(t, c, e, d, old)
	code := d.Wait(2 * time.Minute)
	halted := time.Since(deletedAt)
	out := d.Out.String()
	if code == 0 || strings.Contains(out, "panic") || !strings.Contains(out, "halting") ||
		!strings.Contains(out, e.Topic) || !strings.Contains(out, "--kafka-unknown-topic-timeout") {
		t.Fatalf("after the delete: exit %d, want a halt naming the topic and --kafka-unknown-topic-timeout, no panic:\n%s", code, d.P.Tail(20))
	}
	oldIDs := old.stop()

	// Created again, and restarted.
	recreateTopic(t, c, e.Topic, 6)
	restarted := time.Now()
	d = e.Start(args...)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 0 })
	resumed := time.Since(restarted)
	base := e2e.EndOffsets(e.Brokers, e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > base+200 })
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	want := e.Rows()
	fresh := map[int64]e2e.Row{}
	for id, r := range want {
		if !oldIDs[id] {
			fresh[id] = r
		}
	}
	got := e2e.Consume(t, e.Brokers, e.Topic, fresh, 3*time.Minute)
	v := e2e.Verify(t, want, got) // lost counts the rows only in the old topic
	inNew := map[int64]bool{}
	for _, m := range got {
		if id, err := strconv.ParseInt(e2e.Header(m, "outbox-id"), 10, 64); err == nil {
			inNew[id] = true
		}
	}
	lost := 0
	for id := range want {
		if !oldIDs[id] && !inNew[id] {
			lost++
		}
	}
	t.Logf("topic deleted after %d records read from it: halt %s after the delete (exit %d); recreated, restarted → first record %s; "+
		"%d rows: %d in the old topic, %d in the new one (%d sent again after the halt), lost %d, new topic %s; %s in all",
		len(oldIDs), halted.Round(time.Millisecond), code, resumed.Round(time.Millisecond),
		len(want), len(oldIDs), len(inNew), len(inNew)+len(oldIDs)-len(want), lost, v, time.Since(began).Round(time.Second))
	t.Logf("the halt: %s", e2e.LastLine(out))
	if lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || v.Duplicated != 0 {
		t.Errorf("lost %d, new topic %s", lost, v)
	}
	if halted > 30*time.Second {
		t.Errorf("the halt came %s after the delete, want within --kafka-unknown-topic-timeout and a few lookups", halted)
	}
	d.Stop()
}

// deleteWhileFrozen deletes e's topic while outboxd d is frozen (SIGSTOP)
// and old, reading the topic, has caught up with it, so that the test
// knows every record the delete takes away; outboxd wakes up with events
// to publish and records in flight, and the load goes on. It returns when
// the delete was made.
func deleteWhileFrozen(t *testing.T, c *testenv.KafkaCluster, e *e2e.Env, d *e2e.Daemon, old *idRecorder) time.Time {
	t.Helper()
	_ = syscall.Kill(d.PID(), syscall.SIGSTOP)
	defer func() { _ = syscall.Kill(d.PID(), syscall.SIGCONT) }()
	last := int64(-1)
	e2e.WaitFor(t, time.Minute, func() bool {
		n := e2e.EndOffsets(e.Brokers, e.Topic)
		caught := n == last && old.read() >= n
		last = n
		return caught
	})
	admin, err := sarama.NewClusterAdmin(c.Brokers(), c.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.DeleteTopic(e.Topic); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// recreateTopic creates topic again (6 partitions, 3 replicas) once the
// brokers finished deleting it, and waits until it is in sync.
func recreateTopic(t *testing.T, c *testenv.KafkaCluster, topic string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(c.Brokers(), c.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 3,
			ConfigEntries: map[string]*string{"min.insync.replicas": e2e.Ptr("2")}}, false)
		if err == nil {
			break
		}
		if !errors.Is(err, sarama.ErrTopicAlreadyExists) || time.Now().After(deadline) {
			t.Fatalf("recreate %s: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond) // polling: the delete completes asynchronously
	}
	c.WaitInSync(topic)
}

// The same with a dead-letter topic: the records the brokers no longer take
// are dead-lettered after --kafka-unknown-topic-timeout, outboxd goes on,
// and once the topic is created again its events go there, without a
// restart. Every row is in the old topic, the dead-letter topic or the new
// one, none twice.
func topicDeletedDeadLettered(t *testing.T, c *testenv.KafkaCluster) {
	began := time.Now()
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: c.Brokers(), Topic: c.CreateTopic(t, "deleteddlq", 6), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	dlq := c.CreateTopic(t, "dlq", 1)
	d := e.Start("--kafka-unknown-topic-timeout", "3s", "--dead-letter-topic", dlq)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 200)
	old := recordIDs(t, c.Brokers(), e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) >= 600 })
	deletedAt := deleteWhileFrozen(t, c, e, d, old)
	e2e.WaitFor(t, time.Minute, func() bool {
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) after the delete:\n%s", d.Code, d.P.Tail(20))
		}
		return e2e.EndOffsets(e.Brokers, dlq) > 0
	})
	firstDead := time.Since(deletedAt)
	oldIDs := old.stop()
	recreateTopic(t, c, e.Topic, 6)
	recreated := time.Now()
	e2e.WaitFor(t, time.Minute, func() bool {
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) after the topic was recreated:\n%s", d.Code, d.P.Tail(20))
		}
		return e2e.EndOffsets(e.Brokers, e.Topic) > 0
	})
	resumed := time.Since(recreated)
	base := e2e.EndOffsets(e.Brokers, e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > base+200 })
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	want := e.Rows()
	// Records stop being dead-lettered once the topic is back: the
	// dead-letter topic is complete by now.
	dead := map[int64]bool{}
	fresh := map[int64]e2e.Row{}
	for id, r := range want {
		if !oldIDs[id] {
			fresh[id] = r
		}
	}
	inNew := map[int64]bool{}
	for _, m := range e2e.Consume(t, e.Brokers, dlq, map[int64]e2e.Row{}, time.Minute) {
		if id, err := strconv.ParseInt(e2e.Header(m, "outbox-id"), 10, 64); err == nil {
			dead[id] = true
		}
	}
	for id := range dead {
		delete(fresh, id)
	}
	got := e2e.Consume(t, e.Brokers, e.Topic, fresh, 3*time.Minute)
	twice := 0
	for _, m := range got {
		if id, err := strconv.ParseInt(e2e.Header(m, "outbox-id"), 10, 64); err == nil {
			if inNew[id] || oldIDs[id] || dead[id] {
				twice++
			}
			inNew[id] = true
		}
	}
	lost := 0
	for id := range want {
		if !oldIDs[id] && !dead[id] && !inNew[id] {
			lost++
		}
	}
	t.Logf("topic deleted after %d records read from it, with a dead-letter topic: first dead letter %s after the delete; "+
		"recreated → first record in it %s, no restart (restarts %v); %d rows: %d in the old topic, %d dead-lettered, %d in the new one, "+
		"lost %d, twice %d; %s in all", len(oldIDs), firstDead.Round(time.Millisecond), resumed.Round(time.Millisecond), d.Restarts(),
		len(want), len(oldIDs), len(dead), len(inNew), lost, twice, time.Since(began).Round(time.Second))
	if lost != 0 || twice != 0 {
		t.Errorf("lost %d, twice %d", lost, twice)
	}
	if d.Exited() || strings.Contains(d.Out.String(), "panic") {
		t.Fatalf("outboxd exited or panicked:\n%s", d.P.Tail(20))
	}
	d.Stop()
}

// idRecorder reads a topic's outbox ids as they arrive, until stopped or
// the topic is gone.
type idRecorder struct {
	consumer sarama.Consumer
	pcs      []sarama.PartitionConsumer
	wg       sync.WaitGroup
	mu       sync.Mutex
	ids      map[int64]bool
	n        int64 // records read
}

// read is how many records were read.
func (r *idRecorder) read() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func recordIDs(t *testing.T, brokers []string, topic string) *idRecorder {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.Consumer.Return.Errors = false
	cons, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := cons.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	r := &idRecorder{consumer: cons, ids: map[int64]bool{}}
	for _, p := range parts {
		pc, err := cons.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		r.pcs = append(r.pcs, pc)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for m := range pc.Messages() {
				id, err := strconv.ParseInt(e2e.Header(m, "outbox-id"), 10, 64)
				r.mu.Lock()
				r.n++
				if err == nil {
					r.ids[id] = true
				}
				r.mu.Unlock()
			}
		}()
	}
	return r
}

// stop ends the reading and returns the ids read.
func (r *idRecorder) stop() map[int64]bool {
	for _, pc := range r.pcs {
		pc.AsyncClose() // its Messages channel closes once it stopped
	}
	r.wg.Wait()
	_ = r.consumer.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids
}
