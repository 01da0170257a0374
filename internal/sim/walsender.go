package sim

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Row is one outbox row of the scripted WAL, or one logical decoding
// message (Kind). Table rows' IDs grow in commit order; a message's ID is
// its LSN, the outbox-id outboxd gives it, set when it is committed.
type Row struct {
	ID      int64
	Key     string
	Topic   string
	Payload string // JSON text, as jsonb's output function writes it
	Kind    RowKind
}

// RowKind is what a Row is in the WAL.
type RowKind uint8

const (
	RowInsert RowKind = iota // an INSERT into the outbox table
	// RowEmit is outbox_emit's message: format v3, signed with the key
	// and bound to its transaction's xid. An event, published.
	RowEmit
	// The messages below are not events: nothing of them may reach Kafka.
	RowForged   // outboxd's prefix, signed with another key (bad_mac)
	RowReplayed // authentic content signed in another transaction, emitted again (replayed)
	RowForeign  // another prefix (the frame filter drops its content unread)
	// Bad events: written by a trusted writer, but no record can be made
	// of them, so they go to the dead-letter topic.
	RowBadTopic // an INSERT whose topic is NULL, with no default topic
	RowBadEmit  // outbox_emit's message whose headers set outbox-id, a header outboxd sets
	// RowBigEmit is outbox_emit's message too large to become a record:
	// the frame filter reads it through its MAC check without holding it,
	// and it is a bad event.
	RowBigEmit
)

// Event reports whether the row is an event outboxd must publish.
func (r Row) Event() bool { return r.Kind == RowInsert || r.Kind == RowEmit }

// Bad reports whether the row is a bad event: dead-lettered, not published.
func (r Row) Bad() bool { return r.Kind == RowBadTopic || r.Kind == RowBadEmit || r.Kind == RowBigEmit }

// message reports whether the row is a logical decoding message.
func (r Row) message() bool { return r.Kind != RowInsert && r.Kind != RowBadTopic }

// Txn is one committed PostgreSQL transaction in the walsender's WAL.
type Txn struct {
	Index     int // position in commit order
	Xid       uint32
	Begin     pglogrepl.LSN // the first record's position
	CommitLSN pglogrepl.LSN
	End       pglogrepl.LSN // the commit record's end: what a client confirms
	Rows      []Row
	// Relation describes the table again before the first row, as
	// pgoutput does after an ALTER TABLE or a cache invalidation.
	Relation bool
}

// walMsg is one pgoutput message at its XLogData position.
type walMsg struct {
	at   pglogrepl.LSN
	data []byte
	kind byte
}

// messages are the transaction's pgoutput messages as a walsender sends
// them: Begin, a Relation before the first row of the connection, the rows,
// Commit (whose XLogData starts at the transaction's end LSN, as
// PostgreSQL's does).
func (t *Txn) messages(withRelation bool) []walMsg {
	ct := time.Date(2026, 11, 29, 9, 21, 44, 0, time.UTC).Add(time.Duration(t.Index) * time.Millisecond)
	out := []walMsg{{t.Begin, encodeBegin(t.CommitLSN, ct, t.Xid), 'B'}}
	for i, r := range t.Rows {
		at := t.Begin + pglogrepl.LSN(0x40*(i+1))
		if (withRelation || t.Relation) && i == 0 {
			out = append(out, walMsg{at, encodeRelation(), 'R'})
		}
		if r.message() {
			out = append(out, walMsg{at, encodeMessage(at, r, t.Xid), 'M'})
			continue
		}
		out = append(out, walMsg{at, encodeInsert(r), 'I'})
	}
	return append(out, walMsg{t.End, encodeCommit(t.CommitLSN, t.End, ct), 'C'})
}

// Stage is a message boundary of a replication connection's set-up.
type Stage int

const (
	StageStartup          Stage = iota // the startup message read, not answered
	StageIdentify                      // IDENTIFY_SYSTEM read, not answered
	StageSlotQuery                     // the slot query read, not answered
	StageStartReplication              // START_REPLICATION read, not answered
	StageCopyBoth                      // CopyBothResponse sent: the client sets up its session
	StageFirstStatus                   // the client's first standby status update read
	numStages
)

var stageNames = [...]string{"startup", "identify-system", "slot-query", "start-replication", "copy-both", "first-status"}

func (s Stage) String() string { return stageNames[s] }

// FaultKind is what the walsender does to one connection.
type FaultKind int

const (
	FaultNone       FaultKind = iota
	FaultSetup                // drop the connection at a set-up Stage
	FaultSetupStall           // at a set-up Stage before CopyBoth, answer nothing until the client leaves
	FaultDrop                 // drop the connection after After WAL messages
	FaultStall                // after After WAL messages, send nothing and answer nothing until the client leaves
)

// ConnFault is the fault scripted for one connection (numbered from 0 in
// accept order, history connections included).
type ConnFault struct {
	Kind  FaultKind
	Stage Stage
	After int // WAL messages (XLogData) sent before a drop or stall
	// Hard drops a FaultDrop connection as a crash does: closed at once,
	// so what the client had not read yet may be lost in the reset and it
	// sees the stream end anywhere before the boundary. Otherwise the
	// walsender half-closes at the boundary and the client reads every
	// message before it, then the end.
	Hard bool
	// HoldSlot keeps the slot active for the dropped connection's PID
	// for a moment, as a walsender that has not exited yet does.
	HoldSlot bool
	// Crash makes the drop a server crash: the slot's confirmed position
	// goes back to what was last persisted (PostgreSQL writes a slot's
	// confirmed_flush_lsn to disk at checkpoints, so a crash forgets what
	// was confirmed since), and the next session is sent again what it
	// had confirmed.
	Crash bool
}

func (f ConnFault) String() string {
	s := ""
	switch f.Kind {
	case FaultNone:
		return "none"
	case FaultSetup:
		s = "drop at " + f.Stage.String()
	case FaultSetupStall:
		s = "stall at " + f.Stage.String()
	case FaultDrop:
		s = fmt.Sprintf("drop after %d WAL messages", f.After)
		if f.Hard {
			s = "hard " + s
		}
	case FaultStall:
		s = fmt.Sprintf("stall after %d WAL messages", f.After)
	}
	if f.HoldSlot {
		s += " (slot held a moment)"
	}
	if f.Crash {
		s += " (a crash: the slot forgets what was confirmed since it was persisted)"
	}
	return s
}

// Walsender is a scripted PostgreSQL walsender on loopback TCP: it speaks
// the replication protocol with pgproto3, keeps a WAL of committed
// transactions and one logical slot, and serves START_REPLICATION from the
// slot's confirmed position as PostgreSQL does: every transaction whose end
// is above the confirmed flush position is sent again, whole. It tracks the
// confirmed flush position from the client's standby status updates and
// drops or stalls connections as its fault script says.
type Walsender struct {
	ln     net.Listener
	faults func(conn int) ConnFault

	mu        sync.Mutex
	txns      []*Txn
	walEnd    pglogrepl.LSN // end of the WAL, idle WAL of other tables included
	confirmed pglogrepl.LSN // the slot's confirmed_flush_lsn
	persisted pglogrepl.LSN // what a crash goes back to
	active    bool
	activePID uint32
	appended  chan struct{} // closed and replaced on every commit
	progress  chan struct{} // closed and replaced when confirmed moves
	conns     map[*wconn]struct{}
	nConns    int
	fired     []string // faults that happened, in order
	ended     []string // how each connection ended
	problems  []string // the client broke a rule of the protocol
	closed    bool
	wg        sync.WaitGroup
	nextXid   uint32
}

// StartLSN is the slot's confirmed position before the first transaction.
const StartLSN pglogrepl.LSN = 0x1000000

// NewWalsender listens on a loopback port. faults scripts each connection.
func NewWalsender(faults func(conn int) ConnFault) (*Walsender, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	w := &Walsender{
		ln: ln, faults: faults, walEnd: StartLSN, confirmed: StartLSN, persisted: StartLSN, nextXid: 700,
		appended: make(chan struct{}), progress: make(chan struct{}), conns: map[*wconn]struct{}{},
	}
	w.wg.Add(1)
	go w.accept()
	return w, nil
}

// ConnString is the connection string of the walsender. It sets no
// connect_timeout, as most DSNs do not: every connection the service makes
// must bound its own waits.
func (w *Walsender) ConnString() string {
	port := w.ln.Addr().(*net.TCPAddr).Port
	return fmt.Sprintf("host=127.0.0.1 port=%d user=outboxd dbname=app sslmode=disable", port)
}

// Commit appends a transaction of rows, followed by idle WAL of other
// tables (idle bytes: pgoutput sends nothing for it, only the keepalives'
// WAL end moves); relation sends the table's description again before
// its first row.
func (w *Walsender) Commit(rows []Row, idle int, relation bool) *Txn {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := &Txn{Index: len(w.txns), Xid: w.nextXid, Begin: w.walEnd, Rows: slices.Clone(rows), Relation: relation}
	w.nextXid++
	for i := range t.Rows {
		if t.Rows[i].message() {
			t.Rows[i].ID = int64(t.Begin) + int64(0x40*(i+1)) // as Txn.messages places it
		}
	}
	t.CommitLSN = t.Begin + pglogrepl.LSN(0x40*(len(rows)+1))
	t.End = t.CommitLSN + 0x30
	w.walEnd = t.End + pglogrepl.LSN(idle)
	w.txns = append(w.txns, t)
	close(w.appended)
	w.appended = make(chan struct{})
	return t
}

// Txns is the WAL's transactions in commit order.
func (w *Walsender) Txns() []*Txn {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*Txn(nil), w.txns...)
}

// WALEnd is the end of the WAL.
func (w *Walsender) WALEnd() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.walEnd
}

// Confirmed is the slot's confirmed flush position and a channel closed
// when it next moves.
func (w *Walsender) Confirmed() (pglogrepl.LSN, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.confirmed, w.progress
}

// Fired lists the faults that happened, and Problems the protocol rules the
// client broke (a flush position past what it was sent).
func (w *Walsender) Fired() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.fired...)
}

func (w *Walsender) Problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.problems...)
}

// Ended says how each connection ended.
func (w *Walsender) Ended() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ended...)
}

// Connections is how many connections were accepted.
func (w *Walsender) Connections() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nConns
}

// Close stops listening, drops every connection and waits for their
// goroutines.
func (w *Walsender) Close() {
	w.mu.Lock()
	w.closed = true
	for c := range w.conns {
		c.conn.Close()
	}
	w.mu.Unlock()
	w.ln.Close()
	w.wg.Wait()
}

func (w *Walsender) accept() {
	defer w.wg.Done()
	for {
		nc, err := w.ln.Accept()
		if err != nil {
			return
		}
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			nc.Close()
			return
		}
		n := w.nConns
		w.nConns++
		c := &wconn{w: w, n: n, pid: uint32(5000 + n), conn: nc, backend: pgproto3.NewBackend(nc, nc),
			fault: w.faults(n), done: make(chan struct{})}
		w.conns[c] = struct{}{}
		w.wg.Add(1)
		w.mu.Unlock()
		go c.serve()
	}
}

func (w *Walsender) note(format string, args ...any) {
	w.mu.Lock()
	w.fired = append(w.fired, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// wconn is one client connection.
type wconn struct {
	w       *Walsender
	n       int
	pid     uint32
	conn    net.Conn
	fault   ConnFault
	done    chan struct{} // closed when the connection ends
	sendMu  sync.Mutex    // guards backend writes
	backend *pgproto3.Backend

	holdsSlot bool          // START_REPLICATION took the slot (mu)
	start     pglogrepl.LSN // where streaming started
	sentEnd   atomic.Uint64 // everything below it was sent: what keepalives say
	// limit is the most this connection may confirm: the end of what it
	// is being sent, set before the writes (the client may read and confirm
	// a transaction before the write call that sent it has returned).
	limit    atomic.Uint64
	stalled  atomic.Bool
	statuses atomic.Int64
	dropped  atomic.Bool
}

func (c *wconn) serve() {
	defer c.w.wg.Done()
	err := c.session()
	c.w.mu.Lock()
	c.w.ended = append(c.w.ended, fmt.Sprintf("conn %d (%s): %v", c.n, c.fault, err))
	c.w.mu.Unlock()
	c.conn.Close()
	close(c.done)
	c.release()
	_ = err
}

// drop ends the connection abruptly, as a killed walsender or a cut
// network does.
func (c *wconn) drop(what string) {
	if c.dropped.CompareAndSwap(false, true) {
		c.w.note("conn %d: %s", c.n, what)
		c.conn.Close()
	}
}

// cut ends the stream at a message boundary: the client reads everything
// sent before it, then the end of the connection. What it confirms after
// the cut is not heard (the walsender is gone).
func (c *wconn) cut(what string) {
	if c.fault.Hard {
		c.drop(what)
		return
	}
	if c.dropped.CompareAndSwap(false, true) {
		c.w.note("conn %d: %s", c.n, what)
		if err := c.flush(); err == nil {
			if tc, ok := c.conn.(*net.TCPConn); ok && tc.CloseWrite() == nil {
				return // receive reads on until the client closes
			}
		}
		c.conn.Close()
	}
}

// release frees the slot the connection held, at once or, for a HoldSlot
// fault on a connection that streamed, a moment later.
func (c *wconn) release() {
	w := c.w
	w.mu.Lock()
	delete(w.conns, c)
	holds := c.holdsSlot && w.active && w.activePID == c.pid
	if holds {
		if c.fault.Crash && c.dropped.Load() {
			if w.persisted < w.confirmed {
				w.fired = append(w.fired, fmt.Sprintf("conn %d: crash: the slot goes back from %s to %s", c.n, w.confirmed, w.persisted))
				w.confirmed = w.persisted
			}
		} else {
			// A session's end stands for a checkpoint: what it confirmed
			// is on disk.
			w.persisted = w.confirmed
		}
	}
	w.mu.Unlock()
	if !holds {
		return
	}
	free := func() {
		w.mu.Lock()
		if w.activePID == c.pid {
			w.active, w.activePID = false, 0
		}
		w.mu.Unlock()
	}
	if c.fault.HoldSlot && c.dropped.Load() && c.statuses.Load() > 0 {
		// The old walsender exits a little after its connection is gone:
		// the client's next session finds its own previous PID on the slot.
		time.AfterFunc(150*time.Millisecond, free)
		return
	}
	free()
}

// setupFault runs the connection's fault at set-up stage s; true: the
// connection is over.
func (c *wconn) setupFault(s Stage) bool {
	if c.fault.Stage != s {
		return false
	}
	switch c.fault.Kind {
	case FaultSetup:
		c.drop("dropped at " + s.String())
		return true
	case FaultSetupStall:
		if s < StageCopyBoth {
			c.w.note("conn %d: stalled at %s", c.n, s)
			for { // read on, answer nothing, until the client gives up
				if _, err := c.backend.Receive(); err != nil {
					return true
				}
			}
		}
	}
	return false
}

func (c *wconn) send(msgs ...pgproto3.BackendMessage) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for _, m := range msgs {
		c.backend.Send(m)
	}
	return c.backend.Flush()
}

func (c *wconn) session() error {
	b := c.backend
	for {
		msg, err := b.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		switch msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := c.conn.Write([]byte{'N'}); err != nil {
				return err
			}
			continue
		case *pgproto3.StartupMessage:
		case *pgproto3.CancelRequest:
			return nil // the query it cancels has failed or ended already
		default:
			return fmt.Errorf("walsender: unexpected startup message %T", msg)
		}
		break
	}
	if c.setupFault(StageStartup) {
		return nil
	}
	if err := c.send(&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "15.8"},
		&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"},
		&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "integer_datetimes", Value: "on"},
		&pgproto3.BackendKeyData{ProcessID: c.pid, SecretKey: []byte{0, 0, 0, 1}},
		&pgproto3.ReadyForQuery{TxStatus: 'I'}); err != nil {
		return err
	}
	for {
		msg, err := b.Receive()
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.Query:
			q := msg.String
			switch {
			case q == "IDENTIFY_SYSTEM":
				if c.setupFault(StageIdentify) {
					return nil
				}
				if err := c.identifySystem(); err != nil {
					return err
				}
			case strings.HasPrefix(q, "SELECT") && strings.Contains(q, "pg_replication_slots"):
				if c.setupFault(StageSlotQuery) {
					return nil
				}
				if err := c.slotQuery(); err != nil {
					return err
				}
			case strings.Contains(q, "outbox_emit_key") && strings.Contains(q, "to_regprocedure"):
				if err := c.emitInstalled(); err != nil {
					return err
				}
			case strings.Contains(q, "pg_snapshot_xmax"):
				if err := c.emitKey(); err != nil {
					return err
				}
			case strings.HasPrefix(q, "START_REPLICATION"):
				if c.setupFault(StageStartReplication) {
					return nil
				}
				return c.startReplication(q)
			default:
				if err := c.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "walsender: unexpected query " + q},
					&pgproto3.ReadyForQuery{TxStatus: 'I'}); err != nil {
					return err
				}
			}
		case *pgproto3.Terminate:
			return nil
		default:
			return fmt.Errorf("walsender: unexpected %T before streaming", msg)
		}
	}
}

func (c *wconn) identifySystem() error {
	end := c.w.WALEnd()
	return c.send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
		{Name: []byte("systemid"), DataTypeOID: 25}, {Name: []byte("timeline"), DataTypeOID: 23},
		{Name: []byte("xlogpos"), DataTypeOID: 25}, {Name: []byte("dbname"), DataTypeOID: 25},
	}}, &pgproto3.DataRow{Values: [][]byte{[]byte("7000000000000000001"), []byte("1"), []byte(end.String()), []byte("app")}},
		&pgproto3.CommandComplete{CommandTag: []byte("IDENTIFY_SYSTEM")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
}

// emitInstalled answers the session's question whether outbox_emit and its
// key are installed in the outbox table's schema: they are, migration 009's,
// readable by the session's role.
func (c *wconn) emitInstalled() error {
	f := []pgproto3.FieldDescription{{Name: []byte("emit"), DataTypeOID: 16}, {Name: []byte("tbl"), DataTypeOID: 16},
		{Name: []byte("v3"), DataTypeOID: 16}, {Name: []byte("readable"), DataTypeOID: 16}, {Name: []byte("current_user"), DataTypeOID: 19}}
	return c.send(&pgproto3.RowDescription{Fields: f},
		&pgproto3.DataRow{Values: [][]byte{[]byte("t"), []byte("t"), []byte("t"), []byte("t"), []byte("outboxd")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
}

// emitKey answers the read of outbox_emit_key: the key outbox_emit signs
// with, its pads, the next key, no previous one, installed (with format v3)
// before the WAL's start, and the server's next transaction id.
func (c *wconn) emitKey() error {
	var f []pgproto3.FieldDescription
	for range 8 {
		f = append(f, pgproto3.FieldDescription{Name: []byte("v"), DataTypeOID: 25})
	}
	c.w.mu.Lock()
	next := c.w.nextXid
	c.w.mu.Unlock()
	row := [][]byte{
		[]byte(hex.EncodeToString(emitKey)), []byte(hex.EncodeToString(hmacPad(emitKey, 0x36))),
		[]byte(hex.EncodeToString(hmacPad(emitKey, 0x5c))), []byte(hex.EncodeToString(nextEmitKey)), {},
		[]byte("0/0"), []byte("0/0"), []byte(strconv.FormatUint(uint64(next), 10)),
	}
	return c.send(&pgproto3.RowDescription{Fields: f}, &pgproto3.DataRow{Values: row},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
}

func (c *wconn) slotQuery() error {
	w := c.w
	w.mu.Lock()
	active, pid, confirmed := "f", "0", w.confirmed.String()
	if w.active {
		active, pid = "t", fmt.Sprint(w.activePID)
	}
	w.mu.Unlock()
	fields := []pgproto3.FieldDescription{
		{Name: []byte("plugin"), DataTypeOID: 19}, {Name: []byte("active"), DataTypeOID: 16},
		{Name: []byte("coalesce"), DataTypeOID: 23}, {Name: []byte("coalesce"), DataTypeOID: 25},
		{Name: []byte("coalesce"), DataTypeOID: 25}, {Name: []byte("coalesce"), DataTypeOID: 26},
	}
	row := [][]byte{[]byte("pgoutput"), []byte(active), []byte(pid), []byte(confirmed), []byte("reserved"), []byte("16384")}
	return c.send(&pgproto3.RowDescription{Fields: fields}, &pgproto3.DataRow{Values: row},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
}

// startReplication takes the slot and streams from its confirmed position
// (a requested position below it is raised to it, as PostgreSQL does).
func (c *wconn) startReplication(q string) error {
	w := c.w
	f := strings.Fields(q)
	var req pglogrepl.LSN
	for i, s := range f {
		if s == "LOGICAL" && i+1 < len(f) {
			req, _ = pglogrepl.ParseLSN(f[i+1])
		}
	}
	w.mu.Lock()
	if w.active {
		pid := w.activePID
		w.mu.Unlock()
		return c.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "55006",
			Message: fmt.Sprintf("replication slot \"outboxd\" is active for PID %d", pid)},
			&pgproto3.ReadyForQuery{TxStatus: 'I'})
	}
	w.active, w.activePID, c.holdsSlot = true, c.pid, true
	c.start = max(req, w.confirmed)
	w.mu.Unlock()
	c.sentEnd.Store(uint64(c.start))
	c.limit.Store(uint64(c.start))
	if err := c.send(&pgproto3.CopyBothResponse{}); err != nil {
		return err
	}
	if c.setupFault(StageCopyBoth) {
		return nil
	}
	sent, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sent)
		c.sendWAL(stop)
	}()
	err := c.receive()
	close(stop)
	c.conn.Close() // ends a write sendWAL is blocked in
	<-sent
	return err
}

// receive reads the client's standby status updates until it leaves.
func (c *wconn) receive() error {
	for {
		msg, err := c.backend.Receive()
		if err != nil {
			return err
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			d := msg.Data
			if len(d) != 34 || d[0] != 'r' {
				return fmt.Errorf("walsender: unexpected CopyData %q", d)
			}
			if c.dropped.Load() {
				continue // sent to a walsender that is gone
			}
			flush := pglogrepl.LSN(binary.BigEndian.Uint64(d[9:]))
			c.statuses.Add(1)
			c.confirm(flush)
			if c.statuses.Load() == 1 && c.setupFault(StageFirstStatus) {
				return nil
			}
			if d[33] == 1 && !c.stalled.Load() {
				if err := c.send(&pgproto3.CopyData{Data: keepalive(pglogrepl.LSN(c.sentEnd.Load()), false)}); err != nil {
					return err
				}
			}
		case *pgproto3.CopyDone, *pgproto3.Terminate:
			return nil
		default:
			return fmt.Errorf("walsender: unexpected %T while streaming", msg)
		}
	}
}

// confirm records a flush position. PostgreSQL keeps the highest; one
// past what this connection was sent is a broken rule of the protocol.
func (c *wconn) confirm(flush pglogrepl.LSN) {
	w := c.w
	sent := pglogrepl.LSN(c.limit.Load())
	w.mu.Lock()
	defer w.mu.Unlock()
	if flush > sent && flush > w.confirmed {
		w.problems = append(w.problems, fmt.Sprintf("conn %d confirmed %s, past what it was sent (%s)", c.n, flush, sent))
	}
	if flush > w.confirmed {
		w.confirmed = flush
		close(w.progress)
		w.progress = make(chan struct{})
	}
}

// idleKeepalive is how often a caught-up walsender tells the client its WAL
// end unasked (PostgreSQL does at wal_sender_timeout/2 without news from
// the client; sooner here, so idle WAL is confirmed soon).
const idleKeepalive = 100 * time.Millisecond

// sendWAL sends every transaction ending above the start, then each one
// committed later, with keepalives when caught up, until the connection
// ends (stop) or its fault fires.
func (c *wconn) sendWAL(stop <-chan struct{}) {
	w := c.w
	w.mu.Lock()
	idx := 0
	for idx < len(w.txns) && w.txns[idx].End <= c.start {
		idx++
	}
	w.mu.Unlock()
	relation := true // pgoutput describes the table once per session
	sent, idles := 0, 0
	idle := time.NewTicker(idleKeepalive)
	defer idle.Stop()
	for {
		w.mu.Lock()
		pending := w.txns[idx:]
		walEnd, appended := w.walEnd, w.appended
		w.mu.Unlock()
		for _, t := range pending {
			c.limit.Store(uint64(t.End))
			for _, m := range t.messages(relation) {
				if c.fault.Kind == FaultDrop && sent == c.fault.After {
					c.cut(fmt.Sprintf("dropped after %d WAL messages (before %q of txn %d)", sent, m.kind, t.Index))
					return
				}
				if c.fault.Kind == FaultStall && sent == c.fault.After {
					c.stalled.Store(true)
					w.note("conn %d: stalled after %d WAL messages (before %q of txn %d)", c.n, sent, m.kind, t.Index)
					<-stop
					return
				}
				c.sendMu.Lock()
				c.backend.Send(&pgproto3.CopyData{Data: xlogData(m.at, m.data)})
				c.sendMu.Unlock()
				sent++
			}
			relation = false
			if err := c.flush(); err != nil {
				return
			}
			c.sentEnd.Store(uint64(t.End))
		}
		idx += len(pending)
		if len(pending) > 0 {
			continue
		}
		c.limit.Store(uint64(walEnd))
		c.sentEnd.Store(uint64(walEnd))
		// Now and then ask for a reply, as a walsender does when it has
		// not heard from the client for wal_sender_timeout/2.
		idles++
		if err := c.send(&pgproto3.CopyData{Data: keepalive(walEnd, idles%4 == 0)}); err != nil {
			return
		}
		select {
		case <-appended:
		case <-idle.C:
		case <-stop:
			return
		}
	}
}

func (c *wconn) flush() error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	err := c.backend.Flush()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return err
}
