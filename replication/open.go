package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

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
	// The frame filter reads what TLS decrypted (pgconn hands BuildFrontend
	// the connection after TLS) and leaves the net.Conn itself alone:
	// wrapping it instead (AfterNetConnect) would hide the *tls.Conn from
	// SCRAM's channel binding.
	foreign := newForeignLog(log, cfg.OnForeignMessage)
	build := pcfg.BuildFrontend
	var filter *frameFilter // the last connection attempt's: the one that connected
	pcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		filter = newFrameFilter(r, MessagePrefix, foreign.note)
		return build(filter, w)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("replication: connect: %w", err)
	}
	s := &Stream{cfg: cfg, log: log, conn: conn, filter: filter} // startReplication makes the decoder
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

// slotQuery reads a slot's row, the slot name's literal appended: plugin,
// active, active_pid, confirmed_flush_lsn, wal_status, datoid.
const slotQuery = "SELECT plugin, active, coalesce(active_pid, 0), coalesce(confirmed_flush_lsn::text, '0/0'), coalesce(wal_status, ''), coalesce(datoid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = "

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
	res := s.conn.Exec(ctx, slotQuery+slotLit)
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
	if key != nil && s.cfg.MaxMessageBytes > 0 && s.filter != nil {
		// The key is read on the connection the filter reads, so the
		// filter learns it here, before the stream starts.
		s.dec.streamed = &streamedMessages{}
		s.filter.streamOwn(key, s.cfg.MaxMessageBytes, s.dec.streamed)
	}
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
	if s.cfg.OnConfirm != nil {
		// The slot's position on this server: what a fence answers from
		// until this stream confirms more (after a failover it can be below
		// what the last stream confirmed on the old primary).
		s.cfg.OnConfirm(s.start)
	}
	s.alive = startSetupKeepalive(s)
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

// Close closes the connection. Safe to call more than once.
func (s *Stream) Close() {
	if s.closed {
		return
	}
	s.closed = true
	_ = s.takeConn() // the connection closes either way
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.conn.Close(ctx)
}

// bigForeign is the content size from which a foreign message is worth a
// warning: a stranger's large message is what the frame filter is for.
// Smaller ones, which other tools using logical messages write, are logged
// at debug level only.
const bigForeign = 1 << 20

// foreignLogEvery bounds how often a large foreign message is warned about.
const foreignLogEvery = 10 * time.Second

// foreignLog tells about the foreign logical decoding messages whose
// content a session's frame filter dropped.
type foreignLog struct {
	log  *zap.Logger
	hook func(ForeignMessage) // nil: none

	mu         sync.Mutex
	last       time.Time
	suppressed int   // large ones not warned about since last
	dropped    int64 // bytes of those
}

func newForeignLog(log *zap.Logger, hook func(ForeignMessage)) *foreignLog {
	return &foreignLog{log: log, hook: hook}
}

func (l *foreignLog) note(m ForeignMessage) {
	if l.hook != nil {
		l.hook(m)
	}
	fields := []zap.Field{zap.Stringer("lsn", m.LSN), zap.String("prefix", m.Prefix), zap.Bool("prefix_cut", m.PrefixCut),
		zap.Int64("bytes", m.Size), zap.Bool("transactional", m.Transactional)}
	if m.Size < bigForeign {
		if ce := l.log.Check(zap.DebugLevel, "dropped the content of a logical decoding message with another prefix than outboxd's"); ce != nil {
			ce.Write(fields...)
		}
		return
	}
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < foreignLogEvery {
		l.suppressed++
		l.dropped += m.Size
		l.mu.Unlock()
		return
	}
	n, b := l.suppressed, l.dropped
	l.last, l.suppressed, l.dropped = now, 0, 0
	l.mu.Unlock()
	if n > 0 {
		fields = append(fields, zap.Int("suppressed_since_last", n), zap.Int64("suppressed_bytes", b))
	}
	l.log.Warn("dropped unread, as it arrived, the content of a large logical decoding message with another prefix than outboxd's: some role emitted it with pg_logical_emit_message; outboxd never holds it in memory (see outboxd_foreign_messages_total)", fields...)
}
