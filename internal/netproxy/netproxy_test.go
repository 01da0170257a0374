package netproxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// echo starts a TCP echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func proxy(t *testing.T, f Faults) (*Proxy, net.Conn) {
	t.Helper()
	p, err := Listen("echo", "127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.Set(f)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

func roundTrip(t *testing.T, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo changed the bytes")
	}
	return time.Since(start)
}

func TestDelayAddsTheRoundTrip(t *testing.T) {
	p, c := proxy(t, Faults{})
	if d := roundTrip(t, c, []byte("x")); d > 50*time.Millisecond {
		t.Fatalf("no delay set, round trip %s", d)
	}
	p.Set(Faults{Delay: 10 * time.Millisecond})
	if d := roundTrip(t, c, []byte("y")); d < 20*time.Millisecond {
		t.Fatalf("delay 10ms each way, round trip %s (want ≥ 20ms)", d)
	}
}

func TestJitterKeepsTheStreamInOrder(t *testing.T) {
	_, c := proxy(t, Faults{Delay: 2 * time.Millisecond, Jitter: 2 * time.Millisecond})
	var all []byte
	done := make(chan []byte)
	go func() {
		b := make([]byte, 200*100)
		_, err := io.ReadFull(c, b)
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	for i := range 200 {
		msg := bytes.Repeat([]byte{byte(i)}, 100)
		all = append(all, msg...)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	if got := <-done; !bytes.Equal(got, all) {
		t.Fatal("bytes reordered or changed")
	}
}

func TestBlackholeHoldsUntilHealed(t *testing.T) {
	p, c := proxy(t, Faults{Blackhole: true})
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); n != 0 || err == nil {
		t.Fatalf("black hole answered: %d bytes, %v", n, err)
	}
	c.SetReadDeadline(time.Time{})
	p.Set(Faults{})
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after healing: %q, %v", got, err)
	}
}

func TestBandwidthSpacesWrites(t *testing.T) {
	_, c := proxy(t, Faults{Bandwidth: 1 << 20}) // 1 MiB/s each way
	d := roundTrip(t, c, make([]byte, 256<<10))
	if d < 200*time.Millisecond {
		t.Fatalf("256 KiB through 1 MiB/s each way in %s (want ≥ 200ms)", d)
	}
}

func TestResetCutsConnections(t *testing.T) {
	p, c := proxy(t, Faults{Blackhole: true})
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The kernel completes the handshake before the proxy accepts: cut the
	// connection once the proxy holds it.
	for deadline := time.Now().Add(10 * time.Second); p.Conns() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not accept the connection within 10s")
		}
	}
	p.Reset()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read after reset: %v (want the connection closed)", err)
	}
	p2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("new connection after reset: %v", err)
	}
	p2.Close()
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestApply(t *testing.T) {
	q := map[string]string{"rtt": "2ms", "jitter": "100us", "blackhole": "on", "bandwidth": "1000"}
	f, err := Apply(Faults{}, func(k string) (string, bool) { v, ok := q[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if f != (Faults{Delay: time.Millisecond, Jitter: 100 * time.Microsecond, Blackhole: true, Bandwidth: 1000}) {
		t.Fatalf("got %+v", f)
	}
	if _, err := Apply(f, func(k string) (string, bool) { return "x", k == "delay" }); err == nil {
		t.Fatal("delay=x accepted")
	}
}
