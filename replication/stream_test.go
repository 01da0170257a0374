package replication

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Generous bounds for conditions that hold within milliseconds, so that the
// tests stay reliable under -race on a loaded machine.
const (
	soon = 2 * time.Second
)

// fakeTxn is one outbox transaction as the server sends it.
type fakeTxn struct {
	base              pglogrepl.LSN // WAL position of the first message
	commitLSN, endLSN pglogrepl.LSN
	msgs              [][]byte // Begin, Relation, Inserts, Commit
}

func newTxn(base pglogrepl.LSN, xid uint32, ids ...int64) fakeTxn {
	t := fakeTxn{base: base, commitLSN: base + 0x100, endLSN: base + 0x130}
	t.msgs = append(t.msgs, encodeBegin(t.commitLSN, commitTime, xid), outboxRelation())
	for _, id := range ids {
		t.msgs = append(t.msgs, outboxInsert(id, "agg"))
	}
	t.msgs = append(t.msgs, encodeCommit(t.commitLSN, t.endLSN, commitTime))
	return t
}

func (f *fakeServer) sendTxn(t fakeTxn) { f.sendWAL(t.base, t.msgs...) }

// walAfter is the WAL position just past the first n messages of t.
func (t fakeTxn) walAfter(n int) pglogrepl.LSN {
	p := t.base
	for _, m := range t.msgs[:n] {
		p += pglogrepl.LSN(len(m))
	}
	return p
}

func kinds(ms []Message) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(m.Kind.String())
	}
	return b.String()
}

// Rule: while out is full (backpressure) standby status updates keep flowing
// every StatusInterval, each with flush = progress.Confirmed(), so that
// wal_sender_timeout never fires because the downstream is slow.
func TestStreamStatusWhileBackpressured(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f)) // StatusInterval 20 ms
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1, 2)
	f.sendTxn(txn)
	if m := r.recv(soon); m.Kind != KindBegin {
		t.Fatalf("got %s, want begin", m.Kind)
	}
	// Nobody reads the Insert: Run is blocked delivering it once it reported
	// the Insert as received.
	f.waitStatus(soon, "write past the first insert", func(u statusUpdate) bool { return u.write >= txn.walAfter(3) })
	for i := range 3 {
		u := f.nextStatus(soon)
		if u.flush != 0x1000 {
			t.Fatalf("update %d while blocked: flush %s, want progress.Confirmed() 0/1000", i, u.flush)
		}
	}
	p.confirm(0x1800)
	f.waitStatus(soon, "flush 0/1800 (the new progress.Confirmed())", func(u statusUpdate) bool { return u.flush == 0x1800 })
	r.notReturned()
	if m := r.recv(soon); m.Kind != KindEvent || m.Event.ID != 1 {
		t.Fatalf("after backpressure got %s %d, want event 1", m.Kind, m.Event.ID)
	}
}

// Rule: the position confirmed after a transaction is its Commit's end LSN,
// never its commit LSN (confirming the commit LSN makes the server send the
// transaction again after every restart).
func TestStreamFlushIsCommitEndLSN(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 16, p)
	txn := newTxn(0x2000, 7, 1)
	sent := time.Now()
	f.sendTxn(txn)
	var c Message
	for c.Kind != KindCommit {
		c = r.recv(soon)
		// The Begin says when it was read off the connection (the
		// PostgreSQL side of the latency metrics).
		if c.Kind == KindBegin && (c.Begin.Received.Before(sent) || c.Begin.Received.After(time.Now())) {
			t.Fatalf("Begin.Received %v, want between sending (%v) and now", c.Begin.Received, sent)
		}
	}
	if c.Commit.EndLSN != txn.endLSN || c.Commit.CommitLSN != txn.commitLSN {
		t.Fatalf("commit: end %s commit %s, want end %s commit %s", c.Commit.EndLSN, c.Commit.CommitLSN, txn.endLSN, txn.commitLSN)
	}
	p.confirm(c.Commit.EndLSN) // as the pipeline does once every event is acked
	u := f.waitStatus(soon, "flush past the commit", func(u statusUpdate) bool { return u.flush > 0x1000 })
	if u.flush != txn.endLSN {
		t.Fatalf("flush %s, want the commit's end LSN %s (commit LSN is %s)", u.flush, txn.endLSN, txn.commitLSN)
	}
	if u.write < u.flush || u.apply != u.flush {
		t.Fatalf("write %s apply %s, want write ≥ flush = apply %s", u.write, u.apply, u.flush)
	}
}

// Rule: with nothing in flight (every delivered commit confirmed, no
// transaction open) a keepalive's WAL end is confirmed, so an idle outbox does
// not pin WAL while other tables write; while a transaction is open or not
// yet confirmed it is not; and flush never moves backwards.
func TestStreamIdleConfirm(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 16, p)

	// Idle: the keepalive's WAL end is confirmed.
	f.sendKeepalive(0x5000, false)
	f.waitStatus(soon, "flush = keepalive WAL end 0/5000", func(u statusUpdate) bool { return u.flush == 0x5000 })

	// A transaction open: a later keepalive's WAL end is not confirmed, and
	// flush stays at 0/5000 although the consumer's position is 0/1000.
	txn := newTxn(0x6000, 8, 1)
	f.sendWAL(txn.base, txn.msgs[:3]...) // Begin, Relation, Insert
	r.recv(soon)
	r.recv(soon)
	f.sendKeepalive(0x7000, true)
	u := f.waitStatus(soon, "the reply to the keepalive", func(u statusUpdate) bool { return u.write >= 0x7000 })
	if u.flush != 0x5000 {
		t.Fatalf("transaction open: flush %s, want 0/5000 (neither the keepalive's 0/7000 nor backwards)", u.flush)
	}

	// Committed but not confirmed: still not.
	f.sendWAL(txn.walAfter(3), txn.msgs[3])
	if m := r.recv(soon); m.Kind != KindCommit {
		t.Fatalf("got %s, want commit", m.Kind)
	}
	f.sendKeepalive(0x8000, true)
	u = f.waitStatus(soon, "the reply to the keepalive", func(u statusUpdate) bool { return u.write >= 0x8000 })
	if u.flush != 0x5000 {
		t.Fatalf("commit not confirmed: flush %s, want 0/5000", u.flush)
	}

	// Confirmed: idle again, the keepalive's WAL end is confirmed.
	p.confirm(txn.endLSN)
	f.sendKeepalive(0x9000, false)
	f.waitStatus(soon, "flush = keepalive WAL end 0/9000", func(u statusUpdate) bool { return u.flush == 0x9000 })
}

// Rule: a keepalive with ReplyRequested gets a status update at once, not at
// the next StatusInterval.
func TestStreamKeepaliveReplyRequested(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(f)
	cfg.StatusInterval = time.Hour
	s := openFake(t, f, cfg)
	p := newFakeProgress(0x1000)
	startRun(t, f, s, 16, p)
	f.nextStatus(soon) // the one Run sends when it starts
	f.sendKeepalive(0x3000, true)
	u := f.nextStatus(soon)
	if u.write != 0x3000 {
		t.Fatalf("reply: write %s, want the keepalive's WAL end 0/3000", u.write)
	}
}

// Rule: cancelling ctx inside a transaction still delivers the rest of it,
// then closes out without starting the next one; Run keeps sending status
// updates until progress.Done() is closed, then sends a final one with the
// last confirmed position and returns nil.
func TestStreamStopInsideTransaction(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1, 2)
	f.sendWAL(txn.base, txn.msgs[:3]...) // Begin, Relation, Insert 1
	r.recv(soon)
	r.recv(soon)
	r.cancel()
	next := newTxn(0x3000, 8, 3)
	f.sendWAL(txn.walAfter(3), append(txn.msgs[3:], next.msgs...)...) // Insert 2, Commit, then a whole next transaction
	got := r.closed(soon)
	if kinds(got) != "event commit" || got[0].Event.ID != 2 {
		t.Fatalf("after cancel got %q, want the rest of the transaction: event 2, commit", kinds(got))
	}

	// Draining: status updates keep flowing until Done.
	f.drainStatus()
	f.nextStatus(soon)
	f.nextStatus(soon)
	r.notReturned()
	p.confirm(txn.endLSN)
	p.finish()
	if err := r.result(soon); err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
	last := f.waitStatus(soon, "the final flush", func(u statusUpdate) bool { return u.flush == txn.endLSN })
	if last.flush != txn.endLSN {
		t.Fatalf("final flush %s, want %s", last.flush, txn.endLSN)
	}
}

// Rule: cancelling ctx between transactions stops reading at once: nothing of
// a transaction that arrives afterwards is delivered.
func TestStreamStopBetweenTransactions(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1)
	f.sendTxn(txn)
	for range 3 {
		r.recv(soon)
	}
	r.cancel()
	f.sendTxn(newTxn(0x3000, 8, 2))
	if got := r.closed(soon); len(got) != 0 {
		t.Fatalf("after cancel between transactions got %q, want nothing", kinds(got))
	}
	p.finish()
	if err := r.result(soon); err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
}

// Rule: when the consumer gives up (progress.Done() closed) while Run is
// blocked delivering to it, Run returns promptly: no goroutine stays blocked
// on a channel nobody reads.
func TestStreamConsumerGoneWhileBlocked(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1)
	f.sendTxn(txn)
	// Begin received and not read: Run is blocked in deliver.
	f.waitStatus(soon, "write past the begin", func(u statusUpdate) bool { return u.write >= txn.walAfter(1) })
	f.nextStatus(soon)
	p.finish()
	if err := r.result(soon); err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
	if got := r.closed(soon); len(got) != 0 {
		t.Fatalf("got %q after the consumer left", kinds(got))
	}
}

// Rule: a server that sends nothing, not even a keepalive when asked, ends
// Run with ErrServerSilent after ServerTimeout; the stream asks (a status
// update with ReplyRequested) at half of it.
func TestStreamServerSilent(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(f)
	cfg.StatusInterval = time.Hour
	cfg.ServerTimeout = 300 * time.Millisecond
	s := openFake(t, f, cfg)
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 16, p)
	err := r.result(cfg.ServerTimeout + soon)
	elapsed := time.Since(r.started)
	if !errors.Is(err, ErrServerSilent) {
		t.Fatalf("Run: %v, want ErrServerSilent", err)
	}
	if elapsed < cfg.ServerTimeout {
		t.Fatalf("ErrServerSilent after %s, before ServerTimeout %s", elapsed, cfg.ServerTimeout)
	}
	if msg := err.Error(); !strings.Contains(msg, "half-open") || !strings.Contains(msg, "restarts") || strings.Contains(msg, "\n") {
		t.Fatalf("message %q: want one line saying what it means and that the session restarts", msg)
	}
	var pinged bool
	for len(f.status) > 0 {
		u := <-f.status
		if u.replyRequested {
			pinged = true
			if d := u.at.Sub(r.started); d < cfg.ServerTimeout/2 {
				t.Fatalf("pinged after %s, before half of ServerTimeout", d)
			}
		}
	}
	if !pinged {
		t.Fatal("no status update with ReplyRequested before giving up")
	}
}

// Rule: a server that answers the ping keeps the session alive, however long
// nothing else comes.
func TestStreamServerAnswersPing(t *testing.T) {
	f := newFakeServer(t)
	f.answerPings = true
	f.walEnd.Store(0x1000)
	cfg := testConfig(f)
	cfg.StatusInterval = time.Hour
	// 1 s, not less: each ping's answer must come back within half of it,
	// and at a load of 30 a 100 ms half was missed once.
	cfg.ServerTimeout = time.Second
	s := openFake(t, f, cfg)
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 16, p)
	for range 5 { // 5 pings: at least 2.5 × ServerTimeout
		f.waitStatus(soon, "a ping", func(u statusUpdate) bool { return u.replyRequested })
	}
	r.notReturned()
}

// Rule: time blocked delivering to a full out (backpressure) does not count
// as the server's silence: the clock starts again when Run reads again.
func TestStreamBackpressureIsNotSilence(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(f) // StatusInterval 20 ms
	cfg.ServerTimeout = 200 * time.Millisecond
	s := openFake(t, f, cfg)
	p := newFakeProgress(0x1000)
	r := startRun(t, f, s, 0, p)
	txn := newTxn(0x2000, 7, 1)
	f.sendTxn(txn)
	f.waitStatus(soon, "write past the begin", func(u statusUpdate) bool { return u.write >= txn.walAfter(1) })
	// Blocked on the Begin for 3 × ServerTimeout: 30 status updates at 20 ms.
	for range 30 {
		f.nextStatus(soon)
	}
	r.notReturned()
	var resumed time.Time
	for range 3 {
		r.recv(soon)
		resumed = time.Now()
	}
	err := r.result(cfg.ServerTimeout + soon)
	if !errors.Is(err, ErrServerSilent) {
		t.Fatalf("Run: %v, want ErrServerSilent once the server stays silent after reading resumed", err)
	}
	// The commit was handed over at resumed (give or take the channel
	// hand-off): silence counts from then.
	if d := time.Since(resumed); d < cfg.ServerTimeout*3/4 {
		t.Fatalf("ErrServerSilent %s after reading resumed, want ≥ ServerTimeout %s: backpressure counted as silence", d, cfg.ServerTimeout)
	}
}

// Rule: an ErrorResponse from the server ends Run with that error as a
// *pgconn.PgError.
func TestStreamServerError(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	r := startRun(t, f, s, 16, newFakeProgress(0x1000))
	f.send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "XX000", Message: "requested WAL segment has already been removed"})
	err := r.result(soon)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "XX000" {
		t.Fatalf("Run: %v, want the server's error as *pgconn.PgError XX000", err)
	}
}

// Rule: CopyDone from the server ends Run with ErrStreamEnded.
func TestStreamCopyDone(t *testing.T) {
	f := newFakeServer(t)
	s := openFake(t, f, testConfig(f))
	r := startRun(t, f, s, 16, newFakeProgress(0x1000))
	f.send(&pgproto3.CopyDone{})
	if err := r.result(soon); !errors.Is(err, ErrStreamEnded) {
		t.Fatalf("Run: %v, want ErrStreamEnded", err)
	}
}

// Rule: slot and publication names reach the server quoted: the slot as a
// string literal in the slot query and as an identifier in
// START_REPLICATION, the publication as an identifier inside the
// publication_names literal.
func TestStreamQuotesNames(t *testing.T) {
	f := newFakeServer(t)
	cfg := testConfig(f)
	cfg.Slot = `o'dd"slot`
	cfg.Publication = `My'pub"x`
	openFake(t, f, cfg)
	if q := <-f.queries; q != "IDENTIFY_SYSTEM" {
		t.Errorf("first command %q, want IDENTIFY_SYSTEM", q)
	}
	q := <-f.queries
	if want := `WHERE slot_name = 'o''dd"slot'`; !strings.HasSuffix(q, want) {
		t.Errorf("slot query %q, want it to end with %s", q, want)
	}
	q = <-f.queries
	if want := `START_REPLICATION SLOT "o'dd""slot" LOGICAL 0/1000 (proto_version '1', publication_names '"My''pub""x"')`; q != want {
		t.Errorf("got  %s\nwant %s", q, want)
	}
}

// Rule: a missing slot is ErrSlotMissing.
func TestStreamSlotMissing(t *testing.T) {
	f := newFakeServer(t)
	f.slotRow = nil
	go f.serve()
	_, err := Open(context.Background(), testConfig(f), zap.NewNop())
	if !errors.Is(err, ErrSlotMissing) {
		t.Fatalf("Open: %v, want ErrSlotMissing", err)
	}
}

// Rule: without connect_timeout in the DSN, connecting is bounded by
// ConnectTimeout; checking the slot and starting replication are bounded by
// it too.
func TestStreamConnectTimeout(t *testing.T) {
	for _, stage := range []string{"startup", "query"} {
		t.Run(stage, func(t *testing.T) {
			f := newFakeServer(t)
			f.silentAt = stage
			go f.serve()
			cfg := testConfig(f)
			cfg.ConnectTimeout = 200 * time.Millisecond
			// The test's own bound, so that a regression fails rather
			// than hangs.
			ctx, cancel := context.WithTimeout(context.Background(), cfg.ConnectTimeout+soon)
			defer cancel()
			_, err := Open(ctx, cfg, zap.NewNop())
			if err == nil {
				t.Fatal("Open succeeded against a silent server")
			}
			if ctx.Err() != nil {
				t.Fatalf("Open: %v: still waiting after ConnectTimeout %s + %s", err, cfg.ConnectTimeout, soon)
			}
			t.Log(err)
		})
	}
}

// Rule: Validate reports every invalid field at once, one line each, saying
// how to fix it; the defaults are valid.
func TestStreamConfigValidate(t *testing.T) {
	if err := DefaultStreamConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	c := StreamConfig{Publication: strings.Repeat("p", 64), StatusInterval: -time.Second}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted an empty configuration")
	}
	want := []string{
		`replication: slot name is empty: set it (default "outboxd")`,
		`replication: publication name is 64 bytes long, PostgreSQL allows at most 63: choose a shorter name`,
		`replication: status interval must be > 0, got -1s: set a positive duration`,
		`replication: server timeout must be > 0, got 0s: set a positive duration`,
		`replication: connect timeout must be > 0, got 0s: set a positive duration`,
	}
	if got := strings.Split(err.Error(), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", err, strings.Join(want, "\n"))
	}
	c = DefaultStreamConfig()
	c.Slot = "a\x00b"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Fatalf("slot with a NUL byte: %v", err)
	}
}

// Rule: Open takes the defaults for zero durations, so a literal naming only
// the connection, slot and publication keeps working.
func TestStreamConfigZeroDurationsTakeDefaults(t *testing.T) {
	c := StreamConfig{Slot: "s", Publication: "p"}.withDefaults()
	d := DefaultStreamConfig()
	if c.StatusInterval != d.StatusInterval || c.ServerTimeout != d.ServerTimeout || c.ConnectTimeout != d.ConnectTimeout {
		t.Fatalf("got %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// Rule: a slot whose WAL is gone (wal_status lost) is a clear, fatal error,
// not a retry loop.
func TestStreamRefusesALostSlot(t *testing.T) {
	f := newFakeServer(t)
	f.slotRow = []string{"pgoutput", "f", "0", "0/1000", "lost", "16384"}
	go f.serve()
	_, err := Open(context.Background(), testConfig(f), zap.NewNop())
	if !errors.Is(err, ErrSlotLost) || !strings.Contains(err.Error(), "0/1000") {
		t.Fatalf("Open: %v, want ErrSlotLost naming the position", err)
	}
}
