// Package netproxy is a small TCP proxy that puts a network between the
// dev stack's clients and servers: a one-way delay (so a round trip of twice
// it), jitter, a bandwidth cap and a black hole, each switchable while
// connections are open, so tests and make bench-network can measure outboxd
// at a distance from the broker. dev/netproxy runs it as a process with an
// HTTP API (dev/stack proxy-start, proxy-set); tests and the benchmark can
// run it in-process.
//
// The delay is applied to every chunk read from either side, in each
// direction, on its own: a chunk read at t is written at t + Delay (± Jitter),
// never before the chunk read ahead of it, so a stream keeps its order and
// several chunks are in flight at once, as on a link with a long pipe. The
// bandwidth cap spaces writes by their size. A black hole holds the bytes
// (new connections are accepted, nothing is answered) until it is switched
// off, as a partition that TCP rides out would; Reset cuts every open
// connection.
package netproxy

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Faults is the network a proxy simulates. The zero value forwards at once.
type Faults struct {
	// Delay is added to each direction: a round trip takes 2 × Delay more.
	Delay time.Duration `json:"delay_ns"`
	// Jitter spreads each chunk's delay uniformly over Delay ± Jitter
	// (never below zero, never reordering a stream).
	Jitter time.Duration `json:"jitter_ns"`
	// Bandwidth caps each direction of each connection, bytes per second
	// (0: no cap).
	Bandwidth int64 `json:"bandwidth_bytes_per_sec"`
	// Blackhole holds every byte in both directions until it is switched
	// off; connections are still accepted.
	Blackhole bool `json:"blackhole"`
}

// Proxy forwards connections accepted on its address to its upstream.
type Proxy struct {
	Name     string
	Upstream string

	ln     net.Listener
	mu     sync.Mutex
	faults Faults
	// changed is closed and replaced whenever the faults change, waking
	// pipes held by a black hole.
	changed  chan struct{}
	conns    map[*link]struct{}
	resets   int // Reset calls: a connection accepted before one is cut too
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

// Listen starts a proxy on addr (e.g. "127.0.0.1:0") to upstream.
func Listen(name, addr, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{Name: name, Upstream: upstream, ln: ln, changed: make(chan struct{}), conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Faults returns the current faults.
func (p *Proxy) Faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults
}

// Set switches to f; open connections follow from their next chunk.
func (p *Proxy) Set(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
	close(p.changed)
	p.changed = make(chan struct{})
}

// Conns is the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Accepted is the number of connections proxied since the start.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Reset closes every open connection (new ones are still accepted).
func (p *Proxy) Reset() {
	p.mu.Lock()
	p.resets++
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
}

// Close stops accepting, closes every connection and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	p.wg.Wait()
	return err
}

func (p *Proxy) state() (Faults, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults, p.changed
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like
			continue
		}
		p.mu.Lock()
		resets := p.resets
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c, resets)
	}
}

// link is one proxied connection: the client's and the upstream's.
type link struct {
	client, upstream net.Conn
	once             sync.Once
	dead             chan struct{} // closed by close
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.dead)
		l.client.Close()
		if l.upstream != nil {
			l.upstream.Close()
		}
	})
}

// serve proxies c; resets is p.resets when c was accepted, so a Reset
// while the upstream is being dialled cuts c as well.
func (p *Proxy) serve(c net.Conn, resets int) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.Upstream, 10*time.Second)
	if err != nil {
		c.Close()
		return
	}
	for _, x := range []net.Conn{c, up} {
		if t, ok := x.(*net.TCPConn); ok {
			_ = t.SetNoDelay(true)
		}
	}
	l := &link{client: c, upstream: up, dead: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.resets != resets {
		p.mu.Unlock()
		l.close()
		return
	}
	p.conns[l] = struct{}{}
	p.accepted++
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, up, c) }()
	go func() { defer wg.Done(); p.pipe(l, c, up) }()
	wg.Wait()
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

type chunk struct {
	b   []byte
	due time.Time
}

// queued bounds the chunks read ahead of the writer in one direction (at
// 32 KiB each, 8 MiB): beyond it the reader stops and TCP pushes back.
const queued = 256

// pipe copies src to dst through the faults: a reader stamps each chunk
// with the time it may be written, a writer waits for it.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	q := make(chan chunk, queued)
	done := make(chan struct{})
	go p.read(src, q, done)
	defer close(done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var next time.Time // bandwidth: no write before it
	for c := range q {
		for {
			f, changed := p.state()
			if f.Blackhole {
				select {
				case <-changed:
					continue
				case <-l.dead:
					return
				}
			}
			at := c.due
			if next.After(at) {
				at = next
			}
			wait := time.Until(at)
			if wait <= 0 {
				break
			}
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-changed: // a black hole or new bandwidth: look again
				if !timer.Stop() {
					<-timer.C
				}
			case <-l.dead:
				return
			}
			if !time.Now().Before(at) {
				break
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close()
			return
		}
		if f, _ := p.state(); f.Bandwidth > 0 {
			now := time.Now()
			if next.Before(now) {
				next = now
			}
			next = next.Add(time.Duration(float64(len(c.b)) / float64(f.Bandwidth) * float64(time.Second)))
		}
	}
	// src is done: pass the half-close on, so a peer that reads to EOF
	// sees it; the link closes when both directions have ended.
	if t, ok := dst.(*net.TCPConn); ok {
		_ = t.CloseWrite()
	} else {
		l.close()
	}
}

// read reads src into q, each chunk due when the faults of the moment say
// (never before the one before it), until src ends or done is closed.
func (p *Proxy) read(src net.Conn, q chan<- chunk, done <-chan struct{}) {
	defer close(q)
	var last time.Time
	for {
		b := make([]byte, 32<<10)
		n, err := src.Read(b)
		if n > 0 {
			f, _ := p.state()
			due := time.Now()
			if d := f.Delay + jitter(f.Jitter); d > 0 {
				due = due.Add(d)
			}
			if due.Before(last) {
				due = last
			}
			last = due
			select {
			case q <- chunk{b[:n], due}:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func jitter(j time.Duration) time.Duration {
	if j <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(2*j)+1)) - j
}
