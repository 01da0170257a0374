package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/netproxy"
)

// ProxiedKafka is a private broker that clients reach through a TCP proxy
// (internal/netproxy) with a round-trip delay, a black hole and so on,
// switchable while the test runs: the broker advertises the proxy's address
// on the listener behind it, so every request of a client that bootstraps
// from [ProxiedKafka.Brokers] crosses the proxy.
type ProxiedKafka struct {
	// Server is the broker; Server.Brokers is its direct listener, for
	// admin work that should not pay the delay.
	Server *KafkaServer
	Proxy  *netproxy.Proxy
}

// StartKafkaBehindProxy starts a private broker (as [StartKafka]) behind a
// proxy with round-trip time rtt (each direction delayed rtt/2).
func StartKafkaBehindProxy(t testing.TB, rtt time.Duration) *ProxiedKafka {
	t.Helper()
	dir := instanceDir(t, "outboxd-kafka-")
	ports := freePorts(t, 3)
	s := &KafkaServer{Brokers: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}, Dir: dir, Port: ports[0], NodeID: 1, t: t}
	t.Cleanup(func() {
		if err := stack("kafka-stop", dir, "kill"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := stack("kafka-init", dir, strconv.Itoa(ports[0]), strconv.Itoa(ports[1]), "--proxy", strconv.Itoa(ports[2])); err != nil {
		unavailable(t, hintPrivate, "cannot create a private Kafka: %v", err)
	}
	inner, err := os.ReadFile(filepath.Join(dir, "proxied_port"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p, err := netproxy.Listen("kafka", fmt.Sprintf("127.0.0.1:%d", ports[2]), "127.0.0.1:"+strings.TrimSpace(string(inner)))
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	p.Set(netproxy.Faults{Delay: rtt / 2})
	s.Start()
	return &ProxiedKafka{Server: s, Proxy: p}
}

// Brokers is the proxy's address: bootstrap here to go through it.
func (k *ProxiedKafka) Brokers() []string { return []string{k.Proxy.Addr()} }

// Env is a [KafkaEnv] whose clients go through the proxy.
func (k *ProxiedKafka) Env() *KafkaEnv { return &KafkaEnv{Brokers: k.Brokers()} }

// SetRTT changes the round-trip delay; open connections follow at once.
func (k *ProxiedKafka) SetRTT(rtt time.Duration) {
	f := k.Proxy.Faults()
	f.Delay = rtt / 2
	k.Proxy.Set(f)
}

// Blackhole holds every byte between clients and the broker (on) or lets
// them through again (off): a network partition that TCP rides out, where
// SIGSTOP on the broker was the stand-in.
func (k *ProxiedKafka) Blackhole(on bool) {
	f := k.Proxy.Faults()
	f.Blackhole = on
	k.Proxy.Set(f)
}
