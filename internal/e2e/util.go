package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/testenv"
)

// WaitFor polls ok every 100 ms until it holds, and fails the test past
// timeout: the bound of every wait on a condition the test cannot be told of.
func WaitFor(t testing.TB, timeout time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// EOSArgs are the flags of exactly-once delivery (a checkpoint topic of the
// test's own), then extra.
func EOSArgs(extra ...string) []string {
	return append([]string{"--delivery", "exactly-once", "--checkpoint-topic", testenv.UniqueName("checkpoints")}, extra...)
}

// LastLine is the last line a process printed.
func LastLine(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return lines[len(lines)-1]
}

// Ptr is a pointer to s, for sarama's topic configs.
func Ptr(s string) *string { return &s }

// CreateTopic creates a topic on a private cluster.
func CreateTopic(t testing.TB, brokers []string, name string, partitions int32) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := admin.DescribeTopics([]string{name})
		if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError && len(md[0].Partitions) == int(partitions) {
			ok := true
			for _, p := range md[0].Partitions {
				ok = ok && p.Leader >= 0
			}
			if ok {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s has no leaders", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
