package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// fakeServer is the server end of one replication connection, speaking the
// protocol with pgproto3 over a loopback TCP listener: the startup handshake,
// the slot query, START_REPLICATION, then CopyData both ways.
type fakeServer struct {
	t  *testing.T
	ln net.Listener

	// Set before the stream connects.
	slotRow []string // plugin, active, active_pid, confirmed_flush_lsn, wal_status; nil: no slot
	// silentAt stops the handshake: "startup" (never answer the startup
	// message) or "query" (never answer the slot query).
	silentAt string
	// answerPings makes the server answer a status update with
	// ReplyRequested with a keepalive, as a walsender does.
	answerPings bool

	queries chan string       // every Query the client sent
	status  chan statusUpdate // every standby status update, after START_REPLICATION
	ended   chan error        // the client side's end: Terminate, EOF, error

	mu      sync.Mutex // guards backend writes
	backend *pgproto3.Backend
	conn    net.Conn
	ready   chan struct{} // closed once streaming started
	walEnd  atomic.Uint64 // WAL end sent in answers to pings
}

type statusUpdate struct {
	write, flush, apply pglogrepl.LSN
	replyRequested      bool
	at                  time.Time
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{
		t:       t,
		ln:      ln,
		slotRow: []string{"pgoutput", "f", "0", "0/1000", "reserved", "16384"},
		queries: make(chan string, 16),
		status:  make(chan statusUpdate, 1024),
		ended:   make(chan error, 1),
		ready:   make(chan struct{}),
	}
	t.Cleanup(f.close)
	return f
}

// close closes the listener and the connection: the client's next read fails.
func (f *fakeServer) close() {
	f.ln.Close()
	f.mu.Lock()
	if f.conn != nil {
		f.conn.Close()
	}
	f.mu.Unlock()
}

func (f *fakeServer) connString() string {
	addr := f.ln.Addr().(*net.TCPAddr)
	return fmt.Sprintf("host=127.0.0.1 port=%d user=outboxd dbname=app sslmode=disable", addr.Port)
}

// serve accepts one connection and runs the server side of it until the
// client goes away.
func (f *fakeServer) serve() {
	conn, err := f.ln.Accept()
	if err != nil {
		f.ended <- err
		return
	}
	f.mu.Lock()
	f.conn = conn
	f.backend = pgproto3.NewBackend(conn, conn)
	f.mu.Unlock()
	f.ended <- f.session()
}

func (f *fakeServer) session() error {
	b := f.backend
	for {
		msg, err := b.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := f.conn.Write([]byte{'N'}); err != nil {
				return err
			}
			continue
		case *pgproto3.StartupMessage:
		default:
			return fmt.Errorf("fake server: unexpected startup message %T", msg)
		}
		break
	}
	if f.silentAt == "startup" {
		_, err := b.Receive() // until the client gives up
		return err
	}
	f.send(&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "15.8"},
		&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"},
		&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"},
		&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: []byte{0, 0, 0, 1}},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	for {
		msg, err := b.Receive()
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.Query:
			f.queries <- msg.String
			switch {
			case strings.HasPrefix(msg.String, "SELECT"):
				if f.silentAt == "query" {
					continue
				}
				f.answerSlotQuery()
			case msg.String == "IDENTIFY_SYSTEM":
				f.send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
					{Name: []byte("systemid"), DataTypeOID: 25}, {Name: []byte("timeline"), DataTypeOID: 23},
					{Name: []byte("xlogpos"), DataTypeOID: 25}, {Name: []byte("dbname"), DataTypeOID: 25},
				}}, &pgproto3.DataRow{Values: [][]byte{[]byte("7000000000000000001"), []byte("1"), []byte("0/1000000"), []byte("outboxd")}},
					&pgproto3.CommandComplete{CommandTag: []byte("IDENTIFY_SYSTEM")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
			case strings.HasPrefix(msg.String, "START_REPLICATION"):
				f.send(&pgproto3.CopyBothResponse{})
				close(f.ready)
				return f.stream()
			default:
				return fmt.Errorf("fake server: unexpected query %q", msg.String)
			}
		case *pgproto3.Terminate:
			return nil
		default:
			return fmt.Errorf("fake server: unexpected %T before streaming", msg)
		}
	}
}

func (f *fakeServer) answerSlotQuery() {
	msgs := []pgproto3.BackendMessage{&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
		{Name: []byte("plugin"), DataTypeOID: 19},
		{Name: []byte("active"), DataTypeOID: 16},
		{Name: []byte("coalesce"), DataTypeOID: 23},
		{Name: []byte("coalesce"), DataTypeOID: 25},
		{Name: []byte("coalesce"), DataTypeOID: 25},
		{Name: []byte("coalesce"), DataTypeOID: 26},
	}}}
	n := 0
	if f.slotRow != nil {
		row := make([][]byte, len(f.slotRow))
		for i, v := range f.slotRow {
			row[i] = []byte(v)
		}
		msgs = append(msgs, &pgproto3.DataRow{Values: row})
		n = 1
	}
	msgs = append(msgs, &pgproto3.CommandComplete{CommandTag: fmt.Appendf(nil, "SELECT %d", n)},
		&pgproto3.ReadyForQuery{TxStatus: 'I'})
	f.send(msgs...)
}

// stream reads what the client sends while streaming.
func (f *fakeServer) stream() error {
	for {
		msg, err := f.backend.Receive()
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			d := msg.Data
			if len(d) != 34 || d[0] != 'r' {
				return fmt.Errorf("fake server: unexpected CopyData %q", d)
			}
			u := statusUpdate{
				write:          pglogrepl.LSN(binary.BigEndian.Uint64(d[1:])),
				flush:          pglogrepl.LSN(binary.BigEndian.Uint64(d[9:])),
				apply:          pglogrepl.LSN(binary.BigEndian.Uint64(d[17:])),
				replyRequested: d[33] == 1,
				at:             time.Now(),
			}
			f.status <- u
			if u.replyRequested && f.answerPings {
				f.send(&pgproto3.CopyData{Data: keepalive(pglogrepl.LSN(f.walEnd.Load()), false)})
			}
		case *pgproto3.Terminate:
			return nil
		default:
			return fmt.Errorf("fake server: unexpected %T while streaming", msg)
		}
	}
}

// send writes msgs to the client. Safe from any goroutine.
func (f *fakeServer) send(msgs ...pgproto3.BackendMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		f.backend.Send(m)
	}
	if err := f.backend.Flush(); err != nil && !errors.Is(err, net.ErrClosed) {
		f.t.Logf("fake server: send: %v", err)
	}
}

// sendWAL sends each pgoutput message as one XLogData, the first at start,
// each next one just past the previous.
func (f *fakeServer) sendWAL(start pglogrepl.LSN, msgs ...[]byte) {
	out := make([]pgproto3.BackendMessage, len(msgs))
	for i, m := range msgs {
		out[i] = &pgproto3.CopyData{Data: xlogData(start, m)}
		start += pglogrepl.LSN(len(m))
	}
	f.send(out...)
}

func (f *fakeServer) sendKeepalive(walEnd pglogrepl.LSN, replyRequested bool) {
	f.send(&pgproto3.CopyData{Data: keepalive(walEnd, replyRequested)})
}

func xlogData(start pglogrepl.LSN, walData []byte) []byte {
	b := []byte{pglogrepl.XLogDataByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	b = binary.BigEndian.AppendUint64(b, uint64(start)+uint64(len(walData)))
	b = binary.BigEndian.AppendUint64(b, pgMicros(time.Now()))
	return append(b, walData...)
}

func keepalive(walEnd pglogrepl.LSN, replyRequested bool) []byte {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walEnd))
	b = binary.BigEndian.AppendUint64(b, pgMicros(time.Now()))
	if replyRequested {
		return append(b, 1)
	}
	return append(b, 0)
}

// nextStatus returns the next status update the client sends, failing the
// test if none comes within d.
func (f *fakeServer) nextStatus(d time.Duration) statusUpdate {
	f.t.Helper()
	select {
	case u := <-f.status:
		return u
	case <-time.After(d):
		f.t.Fatalf("no status update within %s", d)
		return statusUpdate{}
	}
}

// waitStatus reads status updates until one satisfies ok, failing the test
// after d.
func (f *fakeServer) waitStatus(d time.Duration, what string, ok func(statusUpdate) bool) statusUpdate {
	f.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case u := <-f.status:
			if ok(u) {
				return u
			}
		case <-deadline:
			f.t.Fatalf("no status update with %s within %s", what, d)
			return statusUpdate{}
		}
	}
}

// drainStatus discards the status updates received so far.
func (f *fakeServer) drainStatus() {
	for {
		select {
		case <-f.status:
		default:
			return
		}
	}
}

// fakeProgress is the consumer's side as a Gate with nothing downstream:
// what it has done may be confirmed as it is.
type fakeProgress struct {
	confirmed atomic.Uint64
	done      chan struct{}
	once      sync.Once
}

func newFakeProgress(confirmed pglogrepl.LSN) *fakeProgress {
	p := &fakeProgress{done: make(chan struct{})}
	p.confirmed.Store(uint64(confirmed))
	return p
}

func (p *fakeProgress) Confirmed() pglogrepl.LSN                     { return pglogrepl.LSN(p.confirmed.Load()) }
func (p *fakeProgress) Done() <-chan struct{}                        { return p.done }
func (p *fakeProgress) Confirmable(want pglogrepl.LSN) pglogrepl.LSN { return want }
func (p *fakeProgress) confirm(lsn pglogrepl.LSN)                    { p.confirmed.Store(uint64(lsn)) }
func (p *fakeProgress) finish()                                      { p.once.Do(func() { close(p.done) }) }

// testConfig is a stream configuration for the fake server: fast status
// updates, a server timeout long enough never to fire unless a test wants it.
func testConfig(f *fakeServer) StreamConfig {
	c := DefaultStreamConfig()
	c.ConnString = f.connString()
	c.StatusInterval = 20 * time.Millisecond
	c.ServerTimeout = time.Minute
	c.ConnectTimeout = 5 * time.Second
	return c
}

// openFake opens a stream against f.
func openFake(t *testing.T, f *fakeServer, cfg StreamConfig) *Stream {
	t.Helper()
	go f.serve()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg, zap.NewNop())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// running is one Run in its own goroutine.
type running struct {
	t        *testing.T
	out      chan Message
	progress *fakeProgress
	cancel   context.CancelFunc
	err      chan error
	started  time.Time
}

// startRun runs s with an out channel of capacity outCap.
func startRun(t *testing.T, f *fakeServer, s *Stream, outCap int, progress *fakeProgress) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, out: make(chan Message, outCap), progress: progress, cancel: cancel,
		err: make(chan error, 1), started: time.Now()}
	go func() { r.err <- s.Run(ctx, r.out, progress, nil) }()
	t.Cleanup(func() {
		// Run owns the connection until it returns: end it from the
		// server's side, never by closing the stream under it.
		cancel()
		progress.finish()
		f.close()
		select {
		case <-r.err:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after the test")
		}
	})
	return r
}

// recv returns the next message on out, failing the test after d.
func (r *running) recv(d time.Duration) Message {
	r.t.Helper()
	select {
	case m, ok := <-r.out:
		if !ok {
			r.t.Fatal("out closed, want a message")
		}
		return m
	case <-time.After(d):
		r.t.Fatalf("no message within %s", d)
		return Message{}
	}
}

// closed waits for out to be closed and returns what was still delivered.
func (r *running) closed(d time.Duration) []Message {
	r.t.Helper()
	var got []Message
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-r.out:
			if !ok {
				return got
			}
			got = append(got, m)
		case <-deadline:
			r.t.Fatalf("out not closed within %s (got %d messages)", d, len(got))
			return nil
		}
	}
}

// result waits for Run to return.
func (r *running) result(d time.Duration) error {
	r.t.Helper()
	select {
	case err := <-r.err:
		r.err <- err // for the cleanup
		return err
	case <-time.After(d):
		r.t.Fatalf("Run did not return within %s", d)
		return nil
	}
}

// notReturned fails the test if Run has returned.
func (r *running) notReturned() {
	r.t.Helper()
	select {
	case err := <-r.err:
		r.err <- err
		r.t.Fatalf("Run returned early: %v", err)
	default:
	}
}
