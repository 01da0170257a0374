package testenv

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestKafkaBehindProxy: a client that bootstraps from the proxy produces
// through it (metadata names the proxy, not the broker), pays the round trip
// set, and is held by a black hole until it is lifted.
func TestKafkaBehindProxy(t *testing.T) {
	k := StartKafkaBehindProxy(t, 0)
	env := k.Env()
	topic := env.Topic(t, "proxied", 1)
	cfg := env.Config()
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	client, err := sarama.NewClient(env.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, b := range client.Brokers() {
		if b.Addr() != k.Proxy.Addr() {
			t.Fatalf("metadata names broker %s, not the proxy %s", b.Addr(), k.Proxy.Addr())
		}
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	send := func() time.Duration {
		start := time.Now()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("x")}); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	send()
	k.SetRTT(20 * time.Millisecond)
	if d := send(); d < 20*time.Millisecond {
		t.Fatalf("produce at RTT 20ms took %s", d)
	}
	k.SetRTT(0)
	k.Blackhole(true)
	done := make(chan time.Duration)
	go func() { done <- send() }()
	select {
	case d := <-done:
		t.Fatalf("produce answered through a black hole in %s", d)
	case <-time.After(300 * time.Millisecond):
	}
	k.Blackhole(false)
	<-done
	if k.Proxy.Conns() == 0 {
		t.Fatal("no connection through the proxy")
	}
}
