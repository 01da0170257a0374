package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// Stream owns one replication connection. Exactly one goroutine — the one
// calling Run — uses the connection, for receiving and for status updates
// alike: writing status updates from a second goroutine while another
// receives corrupts the connection.
type Stream struct {
	cfg    StreamConfig
	log    *zap.Logger
	conn   *pgconn.PgConn
	dec    *Decoder
	start  pglogrepl.LSN
	closed bool
	system pglogrepl.IdentifySystemResult
	dbOID  uint32
}

// Open connects to the server, checks the slot and starts logical replication
// from the slot's confirmed position. It returns an error wrapping
// ErrSlotInUse (as a *SlotInUseError) when another process streams from the
// slot, and ErrSlotMissing when the slot does not exist.
//
// Zero durations in cfg take their DefaultStreamConfig values; the result
// must pass Validate. Connecting is bounded by cfg.ConnectTimeout unless the
// connection string sets connect_timeout; checking the slot and starting
// replication are bounded by cfg.ConnectTimeout too.
func Open(ctx context.Context, cfg StreamConfig, log *zap.Logger) (*Stream, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("replication: parse connection string: %w", err)
	}
	if pcfg.ConnectTimeout == 0 {
		pcfg.ConnectTimeout = cfg.ConnectTimeout
	}
	pcfg.RuntimeParams["replication"] = "database"
	// Output functions run with the walsender's settings: pin the text forms
	// the decoder parses.
	pcfg.RuntimeParams["DateStyle"] = "ISO, MDY"
	pcfg.RuntimeParams["TimeZone"] = "UTC"
	if pcfg.RuntimeParams["application_name"] == "" {
		pcfg.RuntimeParams["application_name"] = "outboxd"
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("replication: connect: %w", err)
	}
	s := &Stream{cfg: cfg, log: log, conn: conn} // startReplication makes the decoder
	sctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	if err := s.startReplication(sctx); err != nil {
		s.Close()
		if errors.Is(sctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("replication: no answer from the server within %s while starting replication on slot %q: %w", cfg.ConnectTimeout, cfg.Slot, err)
		}
		return nil, err
	}
	return s, nil
}

// BackendPID is the server process serving this stream.
func (s *Stream) BackendPID() int { return int(s.conn.PID()) }

// StartLSN is the slot's confirmed position the stream started from.
func (s *Stream) StartLSN() pglogrepl.LSN { return s.start }

// Slot is the slot's name.
func (s *Stream) Slot() string { return s.cfg.Slot }

// System is what IDENTIFY_SYSTEM said: the server's system identifier (it
// changes with a new cluster or a restore from a logical dump, not with a
// physical standby's promotion), timeline and database; and the slot's
// database OID, which changes when a database of the same name is created
// anew.
func (s *Stream) System() (systemID string, timeline int32, database string, databaseOID uint32) {
	return s.system.SystemID, s.system.Timeline, s.system.DBName, s.dbOID
}

// quoteLiteral quotes s as a string literal, for SQL and for replication
// commands alike. A walsender speaks the simple query protocol only, so the
// slot name cannot be a bound parameter.
func (s *Stream) quoteLiteral(v string) (string, error) {
	q, err := s.conn.EscapeString(v)
	if err != nil {
		return "", fmt.Errorf("replication: quote %q: %w", v, err)
	}
	return "'" + q + "'", nil
}

func (s *Stream) startReplication(ctx context.Context) error {
	slotLit, err := s.quoteLiteral(s.cfg.Slot)
	if err != nil {
		return err
	}
	// publication_names is a comma-separated list of identifiers inside a
	// string literal: quote the identifier, then the literal.
	pubLit, err := s.quoteLiteral(pgx.Identifier{s.cfg.Publication}.Sanitize())
	if err != nil {
		return err
	}
	if s.system, err = pglogrepl.IdentifySystem(ctx, s.conn); err != nil {
		return fmt.Errorf("replication: identify system: %w", err)
	}
	res := s.conn.Exec(ctx,
		"SELECT plugin, active, coalesce(active_pid, 0), coalesce(confirmed_flush_lsn::text, '0/0'), coalesce(wal_status, ''), coalesce(datoid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = "+slotLit)
	rows, err := res.ReadAll()
	if err != nil {
		return fmt.Errorf("replication: read slot %q: %w", s.cfg.Slot, err)
	}
	if len(rows) == 0 || len(rows[0].Rows) == 0 {
		return fmt.Errorf("%w: replication slot %q does not exist: run \"outboxd slot create\" or start without --no-create", ErrSlotMissing, s.cfg.Slot)
	}
	r := rows[0].Rows[0]
	if plugin := string(r[0]); plugin != "pgoutput" {
		return fmt.Errorf("replication: slot %q uses plugin %q, outboxd needs \"pgoutput\"", s.cfg.Slot, plugin)
	}
	if oid, err := strconv.ParseUint(string(r[5]), 10, 32); err == nil {
		s.dbOID = uint32(oid)
	}
	if string(r[4]) == "lost" {
		return fmt.Errorf("%w: replication slot %q lost WAL it still needed (wal_status lost: invalidated, e.g. by max_slot_wal_keep_size) after position %s: events committed since then can no longer be read; republish them from the outbox table, then drop the slot (\"outboxd slot drop\") and start again with --accept-gap",
			ErrSlotLost, s.cfg.Slot, string(r[3]))
	}
	if string(r[1]) == "t" {
		pid, _ := strconv.Atoi(string(r[2]))
		return &SlotInUseError{Slot: s.cfg.Slot, PID: pid}
	}
	if s.start, err = pglogrepl.ParseLSN(string(r[3])); err != nil {
		return fmt.Errorf("replication: slot %q confirmed_flush_lsn: %w", s.cfg.Slot, err)
	}
	// Logical decoding messages (outbox_emit) are read only when their
	// key is installed (and pgoutput sends them: PostgreSQL 14 on).
	key, err := s.readMessageKey(ctx)
	if err != nil {
		return err
	}
	s.cfg.Decoder.MessageKey, s.cfg.Decoder.Messages = key, key != nil
	s.dec = NewDecoder(s.cfg.Decoder)
	args := []string{"proto_version '1'", "publication_names " + pubLit}
	if s.cfg.Decoder.Messages {
		args = append(args, "messages 'true'")
	}
	err = pglogrepl.StartReplication(ctx, s.conn, pgx.Identifier{s.cfg.Slot}.Sanitize(), s.start, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: args,
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" {
			return slotInUse(s.cfg.Slot, pgErr.Message)
		}
		return fmt.Errorf("replication: start replication on slot %q: %w", s.cfg.Slot, err)
	}
	s.log.Info("streaming", zap.String("slot", s.cfg.Slot), zap.Stringer("from_lsn", s.start))
	return nil
}

// serverMajor is the major version in a server_version parameter ("15.18
// (Debian ...)", "17.6"); 0 when it has none.
func serverMajor(v string) int {
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}

const (
	// stopPoll bounds how long a blocked receive takes to notice a stop
	// request, or a watermark that moved.
	stopPoll = 200 * time.Millisecond
	// eagerStatusGap is the least time between two status updates sent
	// because the watermark moved.
	eagerStatusGap = 100 * time.Millisecond
)

var activePID = regexp.MustCompile(`active for PID (\d+)`)

func slotInUse(slot, msg string) error {
	e := &SlotInUseError{Slot: slot}
	if m := activePID.FindStringSubmatch(msg); m != nil {
		e.PID, _ = strconv.Atoi(m[1])
	}
	return e
}

// RunGated receives, decodes and delivers outbox messages to out, in commit
// order, until ctx is cancelled or the connection fails. It closes out when
// it stops reading. Every status update confirms what gate says may be
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
func (s *Stream) RunGated(ctx context.Context, out chan<- Message, gate Gate, budget Budget) error {
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
	st.lastStatus = time.Now()
	st.lastFlush = flush
	if ce := s.log.Check(zap.DebugLevel, "standby status"); ce != nil {
		ce.Write(zap.Stringer("write", write), zap.Stringer("flush", flush), zap.Bool("ping", ping))
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
		// Receive with a read deadline on the socket rather than a context:
		// a context per message costs a goroutine in pgconn's context
		// watcher (~14% of CPU when draining a backlog). The deadline wakes
		// the loop for the next status update and often enough to notice a
		// stop request.
		wake := now.Add(stopPoll)
		if due.Before(wake) {
			wake = due
		}
		if ping.Before(wake) {
			wake = ping
		}
		if !readDeadline.After(now) || wake.Before(readDeadline) || wake.Sub(readDeadline) > stopPoll/2 {
			if err := s.conn.Conn().SetReadDeadline(wake); err != nil {
				return fmt.Errorf("replication: set read deadline: %w", err)
			}
			readDeadline = wake
		}
		raw, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) {
				continue // a status update is due, or time to look at ctx
			}
			return fmt.Errorf("replication: receive: %w", err)
		}
		got = true
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, msg.Data, out, gate, st); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: server error: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("%w: server ended the copy stream", ErrStreamEnded)
		default:
			// NoticeResponse, ParameterStatus: nothing to do.
		}
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

// Close closes the connection. Safe to call more than once.
func (s *Stream) Close() {
	if s.closed {
		return
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.conn.Close(ctx)
}
