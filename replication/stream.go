package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Stream owns one replication connection. Exactly one goroutine uses the
// connection at a time, for receiving and for status updates alike:
// writing status updates from a second goroutine while another receives
// corrupts the connection. From Open until Run or Close it is the
// keepalive's goroutine (setupalive.go), then the one calling Run.
type Stream struct {
	cfg    StreamConfig
	log    *zap.Logger
	conn   *pgconn.PgConn
	dec    *Decoder
	filter *frameFilter // nil: none (tests)
	start  pglogrepl.LSN
	closed bool
	system pglogrepl.IdentifySystemResult
	dbOID  uint32
	alive  *setupKeepalive // nil once Run or Close took the connection back
}

// Run receives, decodes and delivers outbox messages to out, in commit
// order, until ctx is cancelled or the connection fails. It closes out when
// it stops reading, on every path: a failure before the first message too.
// Out closes inside a transaction only when the stream failed; the consumer
// must then treat the transaction in hand as cut, never as complete. Every status update confirms what gate says may be
// confirmed; budget (nil: none) bounds the bytes of events handed over.
//
// Cancelling ctx stops reading at the next transaction boundary, not the
// stream: it keeps sending status updates until gate.Done() is closed,
// so the last acknowledgements still reach the server, then sends a final
// update and returns nil. Standby status
// updates flow every StatusInterval, when the server asks, and while out is
// full (backpressure), so wal_sender_timeout never fires because the
// downstream is slow.
//
// Run returns an error wrapping ErrServerSilent when the server sends
// nothing for StreamConfig.ServerTimeout of waiting for it; time blocked on
// a full out does not count.
func (s *Stream) Run(ctx context.Context, out chan<- Message, gate Gate, budget Budget) error {
	if err := s.takeConn(); err != nil {
		// The connection broke while the session was setting up: out
		// still ends, or the consumer would wait for ever on a stream that
		// will never deliver.
		close(out)
		return err
	}
	st := &streamState{received: s.start, lastCommitEnd: s.start, budget: budget}
	err := s.receive(ctx, out, gate, st)
	close(out)
	if errors.Is(err, errStopped) {
		err = nil
	}
	if err != nil {
		return err
	}
	// Drain: the consumer finishes what it has; keep the server informed.
	ticker := time.NewTicker(s.cfg.StatusInterval)
	defer ticker.Stop()
	for {
		select {
		case <-gate.Done():
			return s.sendStatus(st, gate, false)
		case <-ticker.C:
			if err := s.sendStatus(st, gate, false); err != nil {
				return err
			}
		}
	}
}

// streamState is owned by the Run goroutine.
type streamState struct {
	budget        Budget        // nil: none
	received      pglogrepl.LSN // highest position received
	serverWALEnd  pglogrepl.LSN // from the last keepalive
	lastCommitEnd pglogrepl.LSN // end LSN of the last Commit delivered
	inTxn         bool
	lastStatus    time.Time
	lastFlush     pglogrepl.LSN // flush position of the last status update
	// heard is when the stream last heard from the server, or went back to
	// waiting for it (after a wait on out): only time spent waiting for the
	// server counts as its silence.
	heard  time.Time
	pinged bool // a status update asking for a reply went out since heard
}

// flushPosition is the position safe to confirm. When every delivered
// transaction is done and none is open, everything the server sent before its
// last keepalive is accounted for, so the keepalive's WAL end can be
// confirmed: an idle outbox then never pins WAL while other tables write.
func (st *streamState) flushPosition(gate Gate) pglogrepl.LSN {
	confirmed := gate.Confirmed()
	if !st.inTxn && confirmed >= st.lastCommitEnd && st.serverWALEnd > confirmed {
		return st.serverWALEnd
	}
	return confirmed
}

// sendStatus sends a standby status update; ping asks the server to answer
// at once with a keepalive.
func (s *Stream) sendStatus(st *streamState, gate Gate, ping bool) error {
	flush := gate.Confirmable(st.flushPosition(gate))
	if flush < st.lastFlush {
		// Never confirm backwards (after an idle confirm, the consumer's
		// position is below it until its next commit): PostgreSQL stores a
		// lower flush position as given.
		flush = st.lastFlush
	}
	write := st.received
	if write < flush {
		write = flush
	}
	if err := s.sendUpdate(write, flush, ping); err != nil {
		return err
	}
	st.lastStatus = time.Now()
	st.lastFlush = flush
	if s.cfg.OnConfirm != nil {
		s.cfg.OnConfirm(flush)
	}
	if ce := s.log.Check(zap.DebugLevel, "standby status"); ce != nil {
		ce.Write(zap.Stringer("write", write), zap.Stringer("flush", flush), zap.Bool("ping", ping))
	}
	return nil
}

// sendUpdate sends one standby status update.
func (s *Stream) sendUpdate(write, flush pglogrepl.LSN, ping bool) error {
	if flush == 0 {
		// pglogrepl copies write into a zero flush: never let it.
		write = 0
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write,
		WALFlushPosition: flush,
		WALApplyPosition: flush,
		ReplyRequested:   ping,
	})
	if err != nil {
		return fmt.Errorf("replication: send standby status: %w", err)
	}
	return nil
}

func (s *Stream) receive(ctx context.Context, out chan<- Message, gate Gate, st *streamState) error {
	if err := s.sendStatus(st, gate, false); err != nil {
		return err
	}
	var readDeadline time.Time // as last set on the socket
	st.heard = time.Now()
	got := false // the last receive returned a message
	for {
		// A stop takes effect between transactions: the rest of the one in
		// hand is already on its way, and stopping inside it would leave its
		// produced events unconfirmable, to be sent again after a restart.
		if ctx.Err() != nil && !st.inTxn {
			return nil
		}
		select {
		case <-gate.Done():
			return nil // the consumer is gone (failed, or out of time)
		default:
		}
		now := time.Now()
		if got {
			// Set here rather than on receipt, after the message was
			// handled: a wait on out (backpressure) is not the server's
			// silence.
			st.heard, st.pinged, got = now, false, false
		}
		// The watchdog: a half-open connection or a stopped server sends
		// nothing, and a read would wait for ever.
		silence := st.heard.Add(s.cfg.ServerTimeout)
		if !now.Before(silence) {
			return fmt.Errorf("replication: %w: nothing from the server for %s, not even a keepalive when asked: the connection is half-open or the server stopped; the session restarts",
				ErrServerSilent, now.Sub(st.heard).Round(time.Millisecond))
		}
		ping := st.heard.Add(s.cfg.ServerTimeout / 2)
		if !st.pinged && !now.Before(ping) {
			// A live walsender answers a reply request with a keepalive.
			// It sends keepalives of its own only when it has not heard
			// from us for wal_sender_timeout/2, which our status updates
			// never let happen.
			if err := s.sendStatus(st, gate, true); err != nil {
				return err
			}
			st.pinged = true
			continue
		}
		if st.pinged {
			ping = silence
		}
		due := st.lastStatus.Add(s.cfg.StatusInterval)
		if gate.Confirmed() > st.lastFlush && now.Sub(st.lastStatus) >= eagerStatusGap {
			// The watermark moved: tell the server soon rather than at the
			// next interval, which shrinks what a crash would send again.
			due = now
		}
		if !now.Before(due) {
			if err := s.sendStatus(st, gate, false); err != nil {
				return err
			}
			continue
		}
		wake := now.Add(stopPoll)
		if due.Before(wake) {
			wake = due
		}
		if ping.Before(wake) {
			wake = ping
		}
		var err error
		if got, err = s.receiveOne(ctx, out, gate, st, &readDeadline, now, wake); err != nil {
			return err
		}
	}
}

// receiveOne waits until wake for one message from the server and handles
// it; got says one came. It receives with a read deadline on the socket
// rather than a context: a context per message costs a goroutine in
// pgconn's context watcher (~14% of CPU when draining a backlog). The
// deadline wakes the loop for the next status update and often enough to
// notice a stop request.
func (s *Stream) receiveOne(ctx context.Context, out chan<- Message, gate Gate, st *streamState, readDeadline *time.Time, now, wake time.Time) (got bool, err error) {
	if !readDeadline.After(now) || wake.Before(*readDeadline) || wake.Sub(*readDeadline) > stopPoll/2 {
		if err := s.conn.Conn().SetReadDeadline(wake); err != nil {
			return false, fmt.Errorf("replication: set read deadline: %w", err)
		}
		*readDeadline = wake
	}
	raw, err := s.conn.ReceiveMessage(context.Background())
	if err != nil {
		if pgconn.Timeout(err) {
			return false, nil // a status update is due, or time to look at ctx
		}
		return false, fmt.Errorf("replication: receive: %w", err)
	}
	switch msg := raw.(type) {
	case *pgproto3.CopyData:
		return true, s.handleCopyData(ctx, msg.Data, out, gate, st)
	case *pgproto3.ErrorResponse:
		return true, fmt.Errorf("replication: server error: %w", pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return true, fmt.Errorf("%w: server ended the copy stream", ErrStreamEnded)
	default:
		// NoticeResponse, ParameterStatus: nothing to do.
		return true, nil
	}
}

func (s *Stream) handleCopyData(ctx context.Context, data []byte, out chan<- Message, gate Gate, st *streamState) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty CopyData", ErrProtocol)
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		if ka.ServerWALEnd > st.serverWALEnd {
			st.serverWALEnd = ka.ServerWALEnd
		}
		if ka.ServerWALEnd > st.received {
			st.received = ka.ServerWALEnd
		}
		if ka.ReplyRequested {
			return s.sendStatus(st, gate, false)
		}
		return nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		m, err := s.dec.Decode(xld.WALData)
		if err != nil {
			// A bad outbox row goes on as KindBad: the consumer diverts,
			// skips or halts on it; any other error ends the stream.
			if m, err = asBadEvent(err); err != nil {
				return err
			}
		}
		if end := xld.WALStart + pglogrepl.LSN(len(xld.WALData)); end > st.received {
			st.received = end
		}
		if m.Kind == KindNone {
			return nil
		}
		if m.Kind == KindBegin && ctx.Err() != nil {
			// Stopped between transactions: start no new one.
			return errStopped
		}
		m.WALStart = xld.WALStart
		if m.Kind == KindBad {
			m.Bad.LSN = xld.WALStart
		}
		if m.Kind == KindBegin {
			m.Begin.Received = time.Now()
		}
		if err := s.deliver(ctx, out, m, gate, st); err != nil {
			return err
		}
		// Only what was delivered counts as in flight.
		switch m.Kind {
		case KindBegin:
			st.inTxn = true
		case KindCommit:
			st.inTxn = false
			st.lastCommitEnd = m.Commit.EndLSN
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown CopyData type %q", ErrProtocol, data[0])
	}
}

// errStopped ends the receive loop without an error: ctx was cancelled or the
// consumer is gone.
var errStopped = errors.New("replication: stopped")

// deliver hands m to the consumer, sending status updates while it waits:
// first for room in the consumer's Budget (an event), then for room in out.
func (s *Stream) deliver(ctx context.Context, out chan<- Message, m Message, gate Gate, st *streamState) error {
	if b := st.budget; b != nil && (m.Kind == KindEvent || m.Kind == KindBad) {
		n := m.Event.Size()
		if m.Kind == KindBad {
			n = m.Bad.Size()
		}
		if err := s.acquire(ctx, b, n, gate, st); err != nil {
			return err
		}
		m.Budgeted = n
	}
	select {
	case out <- m:
		return nil
	default:
	}
	stop := ctx.Done()
	if st.inTxn {
		stop = nil // finish the transaction in hand (see receive)
	}
	for {
		timer := time.NewTimer(time.Until(st.lastStatus.Add(s.cfg.StatusInterval)))
		select {
		case out <- m:
			timer.Stop()
			return nil
		case <-stop:
			timer.Stop()
			// Not delivered: the transaction is not confirmed and will be
			// read again after a restart.
			return errStopped
		case <-gate.Done():
			timer.Stop()
			return errStopped
		case <-timer.C:
			if err := s.sendStatus(st, gate, false); err != nil {
				return err
			}
		}
	}
}
