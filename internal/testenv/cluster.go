package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// clusterTimeout bounds each wait for the cluster's metadata to converge
// (leaders, in-sync replicas, preferred leaders).
const clusterTimeout = 60 * time.Second

// KafkaCluster is a private replicated Kafka: n KRaft nodes, each broker and
// controller, forming one quorum (dev/stack kafka-cluster-*). With 3 nodes,
// topics get replication factor 3 and min.insync.replicas=2, so one node may
// be down while acks=all producers go on. Its methods fail the test on error,
// so call them from the test's goroutine.
type KafkaCluster struct {
	Dir   string         // holds kafka1..n
	nodes []*KafkaServer // nodes[i] has node.id i+1
	t     testing.TB
}

// StartKafkaCluster formats and starts a private cluster of n nodes (1 to 9)
// in a temporary folder; it is killed and removed at cleanup.
func StartKafkaCluster(t testing.TB, n int) *KafkaCluster {
	t.Helper()
	if n < 1 || n > 9 {
		t.Fatalf("testenv: StartKafkaCluster: n must be 1 to 9, not %d", n)
	}
	dir := instanceDir(t, "outboxd-kafkacluster-")
	c := &KafkaCluster{Dir: dir, t: t}
	t.Cleanup(func() {
		if err := stack("kafka-cluster-stop", dir, "kill"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := stack("kafka-cluster-init", dir, strconv.Itoa(n)); err != nil {
		unavailable(t, hintPrivate, "cannot create a private Kafka cluster: %v", err)
	}
	for i := range n {
		node := filepath.Join(dir, fmt.Sprintf("kafka%d", i+1))
		b, err := os.ReadFile(filepath.Join(node, "port"))
		if err != nil {
			t.Fatalf("testenv: kafka-cluster-init left no port file: %v", err)
		}
		port, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("testenv: port of %s: %v", node, err)
		}
		c.nodes = append(c.nodes, &KafkaServer{
			Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)},
			Dir:     node,
			Port:    port,
			NodeID:  int32(i + 1),
			t:       t,
		})
	}
	// All at once: a node reports started only once a quorum has formed.
	if err := stack("kafka-cluster-start", dir); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return c
}

// Len returns the number of nodes.
func (c *KafkaCluster) Len() int { return len(c.nodes) }

// Node returns node i (0-based; its Kafka node.id is i+1).
func (c *KafkaCluster) Node(i int) *KafkaServer {
	c.t.Helper()
	if i < 0 || i >= len(c.nodes) {
		c.t.Fatalf("testenv: Node(%d) of a %d-node cluster", i, len(c.nodes))
	}
	return c.nodes[i]
}

// Brokers returns the address of every node, whether it runs or not.
func (c *KafkaCluster) Brokers() []string {
	out := make([]string, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, n.Brokers...)
	}
	return out
}

// Env returns the cluster as a KafkaEnv, for its Config and ReadAll.
func (c *KafkaCluster) Env() *KafkaEnv { return &KafkaEnv{Brokers: c.Brokers()} }

// Config returns the same base sarama config as [KafkaEnv.Config].
func (c *KafkaCluster) Config() *sarama.Config { return c.Env().Config() }

// replicas is the replication factor topics get: min(3, nodes).
func (c *KafkaCluster) replicas() int16 { return int16(min(3, len(c.nodes))) }

// CreateTopic creates a uniquely named topic with the given number of
// partitions, replication factor min(3, nodes) and min.insync.replicas one
// less (at least 1), and waits until every partition has a leader and all
// its replicas in sync. The cluster is thrown away at cleanup, topics with it.
func (c *KafkaCluster) CreateTopic(t testing.TB, prefix string, partitions int32) string {
	t.Helper()
	if partitions < 1 {
		partitions = 1
	}
	name := UniqueName(prefix)
	rf := c.replicas()
	minISR := strconv.Itoa(max(1, int(rf)-1))
	detail := &sarama.TopicDetail{
		NumPartitions:     partitions,
		ReplicationFactor: rf,
		ConfigEntries:     map[string]*string{"min.insync.replicas": &minISR},
	}
	err := c.withAdmin(func(admin sarama.ClusterAdmin) error { return admin.CreateTopic(name, detail, false) })
	if err != nil {
		t.Fatalf("testenv: create topic %s: %v", name, err)
	}
	if err := c.waitPartitions(name, "a leader and all replicas in sync", func(p *sarama.PartitionMetadata) bool {
		return p.Leader >= 0 && len(p.Replicas) == int(rf) && len(p.Isr) == len(p.Replicas)
	}); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return name
}

// WaitInSync waits until every partition of topic has a leader and all its
// replicas in the ISR: after a node's restart, it has caught up.
func (c *KafkaCluster) WaitInSync(topic string) {
	c.t.Helper()
	if err := c.waitPartitions(topic, "a leader and all replicas in sync", func(p *sarama.PartitionMetadata) bool {
		return p.Leader >= 0 && len(p.Isr) == len(p.Replicas)
	}); err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
}

// LeaderOf returns the index of the node leading the partition, or -1 when it
// has no leader right now.
func (c *KafkaCluster) LeaderOf(topic string, partition int32) int {
	c.t.Helper()
	md := c.describe(topic)
	for _, p := range md.Partitions {
		if p.ID == partition {
			return c.index(p.Leader)
		}
	}
	c.t.Fatalf("testenv: topic %s has no partition %d", topic, partition)
	return -1
}

// MostLeader returns the index of the node leading the most partitions of
// topic (the lowest index on a tie), or -1 when no partition has a leader.
func (c *KafkaCluster) MostLeader(topic string) int {
	c.t.Helper()
	counts := make([]int, len(c.nodes))
	for _, p := range c.describe(topic).Partitions {
		if i := c.index(p.Leader); i >= 0 {
			counts[i]++
		}
	}
	best := -1
	for i, n := range counts {
		if n > 0 && (best < 0 || n > counts[best]) {
			best = i
		}
	}
	return best
}

// ElectPreferredLeaders runs a preferred leader election for every partition
// of topic and waits until each is led by its preferred (first) replica. The
// preferred replicas must be in sync (see WaitInSync).
func (c *KafkaCluster) ElectPreferredLeaders(topic string) {
	c.t.Helper()
	md := c.describe(topic)
	parts := make([]int32, 0, len(md.Partitions))
	for _, p := range md.Partitions {
		parts = append(parts, p.ID)
	}
	err := c.withAdmin(func(admin sarama.ClusterAdmin) error {
		res, err := admin.ElectLeaders(sarama.PreferredElection, map[string][]int32{topic: parts})
		if err != nil {
			return err
		}
		for p, r := range res[topic] {
			if r != nil && !errors.Is(r.ErrorCode, sarama.ErrNoError) && !errors.Is(r.ErrorCode, sarama.ErrElectionNotNeeded) {
				return fmt.Errorf("partition %d: %w", p, r.ErrorCode)
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("testenv: preferred leader election for %s: %v", topic, err)
	}
	if err := c.waitPartitions(topic, "its preferred leader", func(p *sarama.PartitionMetadata) bool {
		return len(p.Replicas) > 0 && p.Leader == p.Replicas[0]
	}); err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
}

// index maps a Kafka node id to the node's index, -1 if it is none of ours.
func (c *KafkaCluster) index(id int32) int {
	for i, n := range c.nodes {
		if n.NodeID == id {
			return i
		}
	}
	return -1
}

// up returns the addresses of the nodes not known to be stopped or paused,
// which answer requests.
func (c *KafkaCluster) up() []string {
	var out []string
	for _, n := range c.nodes {
		if !n.down && !n.paused {
			out = append(out, n.Brokers...)
		}
	}
	return out
}

// adminConfig is Config with short timeouts: a dead node must not stall a
// poll for the default 30 s.
func (c *KafkaCluster) adminConfig() *sarama.Config {
	cfg := c.Config()
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Net.WriteTimeout = 5 * time.Second
	cfg.Admin.Timeout = 10 * time.Second
	cfg.Metadata.Retry.Max = 1
	return cfg
}

// withAdmin runs fn with a ClusterAdmin connected to the running nodes.
func (c *KafkaCluster) withAdmin(fn func(sarama.ClusterAdmin) error) error {
	admin, err := sarama.NewClusterAdmin(c.up(), c.adminConfig())
	if err != nil {
		return fmt.Errorf("kafka admin for %s: %w", strings.Join(c.up(), ","), err)
	}
	defer admin.Close()
	return fn(admin)
}

// metadata asks the running nodes in turn for topic's metadata, on a fresh
// connection each time (so a node that went away since costs nothing).
func (c *KafkaCluster) metadata(topic string) (*sarama.TopicMetadata, error) {
	cfg := c.adminConfig()
	err := errors.New("no node is running")
	for _, addr := range c.up() {
		b := sarama.NewBroker(addr)
		if err = b.Open(cfg); err != nil {
			continue
		}
		var resp *sarama.MetadataResponse
		resp, err = b.GetMetadata(sarama.NewMetadataRequest(cfg.Version, []string{topic}))
		_ = b.Close()
		if err != nil {
			continue
		}
		if len(resp.Topics) != 1 {
			err = fmt.Errorf("%s answered for %d topics", addr, len(resp.Topics))
			continue
		}
		md := resp.Topics[0]
		if !errors.Is(md.Err, sarama.ErrNoError) {
			err = md.Err
			continue
		}
		return md, nil
	}
	return nil, fmt.Errorf("metadata of %s: %w", topic, err)
}

// describe is metadata that fails the test.
func (c *KafkaCluster) describe(topic string) *sarama.TopicMetadata {
	c.t.Helper()
	md, err := c.metadata(topic)
	if err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
	return md
}

// waitPartitions polls topic's metadata until ok holds for every partition.
func (c *KafkaCluster) waitPartitions(topic, what string, ok func(*sarama.PartitionMetadata) bool) error {
	deadline := time.Now().Add(clusterTimeout)
	for {
		md, err := c.metadata(topic)
		if err == nil {
			ready := len(md.Partitions) > 0
			for _, p := range md.Partitions {
				ready = ready && errors.Is(p.Err, sarama.ErrNoError) && ok(p)
			}
			if ready {
				return nil
			}
			err = fmt.Errorf("not yet: %s", describePartitions(md))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions without %s after %s (%v); see the nodes' server.log in %s",
				topic, what, clusterTimeout, err, filepath.Dir(c.nodes[0].Dir))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// describePartitions renders leader, replicas and ISR of each partition.
func describePartitions(md *sarama.TopicMetadata) string {
	var b strings.Builder
	for i, p := range md.Partitions {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "p%d leader %d replicas %v isr %v", p.ID, p.Leader, p.Replicas, p.Isr)
		if !errors.Is(p.Err, sarama.ErrNoError) {
			fmt.Fprintf(&b, " (%v)", p.Err)
		}
	}
	return b.String()
}

// signal sends sig to the node's broker JVM (its pid is in Dir/pid).
func (s *KafkaServer) signal(sig syscall.Signal) {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.Dir, "pid"))
	if err != nil {
		s.t.Fatalf("testenv: Kafka in %s does not run (no pid file): %v", s.Dir, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		s.t.Fatalf("testenv: pid file of %s: %v", s.Dir, err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		s.t.Fatalf("testenv: %v to Kafka pid %d (%s): %v", sig, pid, s.Dir, err)
	}
}

// Pause freezes the broker (SIGSTOP): its connections stay open but nothing
// answers, as with a long GC pause or a hung host. Resume undoes it.
func (s *KafkaServer) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP)
	s.paused = true
}

// Resume lets a paused broker run again (SIGCONT).
func (s *KafkaServer) Resume() {
	s.t.Helper()
	s.signal(syscall.SIGCONT)
	s.paused = false
}
