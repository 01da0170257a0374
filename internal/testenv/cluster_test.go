package testenv_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestKafkaClusterSurvivesLeaderKill: a 3-node cluster keeps taking acks=all
// idempotent produces while the leader of a partition is killed, takes the
// node back into the ISR when it restarts, and gives it its leadership back
// on a preferred leader election. Not parallel: three brokers are enough for
// a small machine.
func TestKafkaClusterSurvivesLeaderKill(t *testing.T) {
	begin := time.Now()
	c := testenv.StartKafkaCluster(t, 3)
	t.Logf("3-node cluster formatted and started in %s", time.Since(begin).Round(time.Millisecond))
	topic := c.CreateTopic(t, "cluster", 3)

	cfg := c.Config()
	cfg.Version = sarama.V4_1_0_0
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	// Enough retries to outlast a failover (the controller fences a dead
	// node after broker.session.timeout.ms, 4 s in dev/stack).
	cfg.Producer.Retry.Max = 100
	cfg.Producer.Retry.Backoff = 100 * time.Millisecond
	producer, err := sarama.NewSyncProducer(c.Brokers(), cfg)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	var sent []string
	send := func(value string) {
		t.Helper()
		p, off, err := producer.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder(value)})
		if err != nil {
			t.Fatalf("send %s: %v", value, err)
		}
		// Idempotence: a retried batch is written once, so offsets stay dense.
		if p != 0 || off != int64(len(sent)) {
			t.Fatalf("send %s: got partition %d offset %d, want 0/%d", value, p, off, len(sent))
		}
		sent = append(sent, value)
	}
	send("before-kill")

	leader := c.LeaderOf(topic, 0)
	if leader < 0 {
		t.Fatal("partition 0 has no leader")
	}
	killed := time.Now()
	c.Node(leader).Kill()
	send("after-kill")
	t.Logf("killed node %d (leader of partition 0); next produce acked %s after the kill",
		leader, time.Since(killed).Round(time.Millisecond))
	if now := c.LeaderOf(topic, 0); now == leader || now < 0 {
		t.Fatalf("partition 0 is led by node %d after killing node %d", now, leader)
	}

	restart := time.Now()
	c.Node(leader).Start()
	started := time.Since(restart)
	c.WaitInSync(topic)
	t.Logf("killed node restarted in %s (kafka-start), back in every ISR after %s, %s after the kill",
		started.Round(time.Millisecond), time.Since(restart).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	elect := time.Now()
	c.ElectPreferredLeaders(topic)
	if now := c.LeaderOf(topic, 0); now != leader {
		t.Fatalf("after the preferred leader election partition 0 is led by node %d, want %d", now, leader)
	}
	t.Logf("preferred leaders back in %s", time.Since(elect).Round(time.Millisecond))
	send("after-rejoin")

	// A paused (SIGSTOP) follower: acks=all waits until the controller fences
	// it and shrinks the ISR, then goes on with min.insync.replicas=2.
	follower := (leader + 1) % c.Len()
	paused := time.Now()
	c.Node(follower).Pause()
	send("follower-paused")
	t.Logf("paused follower node %d; next produce acked after %s", follower, time.Since(paused).Round(time.Millisecond))
	c.Node(follower).Resume()
	c.WaitInSync(topic)
	t.Logf("resumed follower back in every ISR %s after the pause", time.Since(paused).Round(time.Millisecond))

	msgs := c.Env().ReadAll(t, topic, len(sent), 30*time.Second)
	if len(msgs) != len(sent) {
		t.Fatalf("read %d messages, want %d", len(msgs), len(sent))
	}
	for i, m := range msgs {
		if m.Partition != 0 || m.Offset != int64(i) || string(m.Value) != sent[i] {
			t.Errorf("message %d: %d/%d %q, want 0/%d %q", i, m.Partition, m.Offset, m.Value, i, sent[i])
		}
	}
	if most := c.MostLeader(topic); most < 0 {
		t.Errorf("MostLeader(%s) = %d after recovery", topic, most)
	}
}
