package replication

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// Sentinel errors. Every error returned by Decode wraps exactly one of them;
// test with errors.Is.
var (
	// ErrProtocol reports a message that is malformed or that is not allowed
	// where it appears (an Insert outside a transaction, a streaming message,
	// an unknown message type, ...).
	ErrProtocol = errors.New("replication: protocol violation")
	// ErrUnknownRelation reports an Insert for a relation id that no Relation
	// message described.
	ErrUnknownRelation = errors.New("replication: unknown relation")
	// ErrMissingColumn reports an outbox table that lacks a required column.
	ErrMissingColumn = errors.New("replication: missing column")
	// ErrBadValue reports an outbox row with a value that cannot become an
	// Event (a NULL id, an unparsable created_at, ...).
	ErrBadValue = errors.New("replication: bad value")
)

// DecodeError is returned by Decode for a message it cannot interpret. It
// unwraps to ErrProtocol, ErrUnknownRelation or ErrBadValue.
type DecodeError struct {
	// MsgType is the message's type byte ('B', 'I', ...); 0 for an empty
	// message.
	MsgType byte
	// Offset is the position in walData of the field that failed.
	Offset int
	// Err is the sentinel the error wraps.
	Err error
	// Detail says what was wrong.
	Detail string
	// bad is the row, for a bad value in an outbox row (see asBadEvent).
	bad *BadEvent
}

func (e *DecodeError) Error() string {
	kind := strings.TrimPrefix(e.Err.Error(), "replication: ")
	if e.MsgType == 0 {
		return "replication: " + kind + ": " + e.Detail
	}
	return fmt.Sprintf("replication: %s in %s message at offset %d: %s", kind, msgTypeName(e.MsgType), e.Offset, e.Detail)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// MissingColumnError reports an outbox table without one of the required
// columns id, aggregate_id and payload. It unwraps to ErrMissingColumn.
type MissingColumnError struct {
	Schema, Table, Column string
}

func (e *MissingColumnError) Error() string {
	return fmt.Sprintf("replication: outbox table %s.%s has no column %q", e.Schema, e.Table, e.Column)
}

func (e *MissingColumnError) Unwrap() error { return ErrMissingColumn }

// Columns names the outbox table's columns.
type Columns struct {
	// ID is the event id: bigint, integer, smallint or uuid (required).
	ID string
	// AggregateID is the record key (required).
	AggregateID string
	// Topic is the topic (optional; see DecoderConfig.TopicTemplate).
	Topic string
	// Payload is the record value (required).
	Payload string
	// CreatedAt is the record timestamp (optional): a timestamptz or
	// timestamp, or an integer of milliseconds since the Unix epoch.
	CreatedAt string
	// EventType is an optional column placed in the event-type header.
	EventType string
	// Headers is an optional jsonb (or json) column whose object of string
	// values becomes record headers, e.g. {"traceparent": "00-…"}.
	Headers string
}

// DefaultColumns returns the column names of the standard outbox table: id,
// aggregate_id, topic, payload, created_at, event_type, headers.
func DefaultColumns() Columns {
	return Columns{
		ID:          "id",
		AggregateID: "aggregate_id",
		Topic:       "topic",
		Payload:     "payload",
		CreatedAt:   "created_at",
		EventType:   "event_type",
		Headers:     "headers",
	}
}

// DecoderConfig configures a Decoder. Empty fields take their defaults:
// schema "public", table "outbox", and the names of DefaultColumns. A
// column set to "-" is not read at all (only the optional ones: Topic,
// CreatedAt, EventType, Headers).
type DecoderConfig struct {
	Schema, Table string
	Columns       Columns
	// TopicTemplate, when set, routes every row to the topic it renders
	// instead of reading Columns.Topic: each {column} is replaced by that
	// column's text, e.g. "outbox.event.{aggregatetype}". A row whose
	// placeholder column is NULL has no topic (as a row with a NULL topic
	// column: the default topic, or a poison event).
	TopicTemplate string
	// Messages decodes logical decoding messages of prefix MessagePrefix
	// (written by outbox_emit) as events: the table-less outbox. Only those
	// whose MAC verifies with MessageKey become events; the others are
	// KindRejected. The stream asks pgoutput for them (PostgreSQL 14 or
	// later) only when outbox_emit's key is installed, and fills in
	// MessageKey when it starts; MessagesRequired makes a missing key an
	// error instead (--source=messages).
	Messages         bool
	MessagesRequired bool
	MessageKey       *MessageKey
	// NullPayload makes a NULL payload an event with a nil Payload (a
	// record with a null value: a tombstone, as Debezium's Outbox Event
	// Router sends it) instead of a bad event.
	NullPayload bool
	// HeaderColumns places further columns as headers, in this order,
	// after the event-type header and before those of Columns.Headers. A
	// NULL value sets no header.
	HeaderColumns []HeaderColumn
}

// HeaderColumn places the text of Column in the header named Header.
type HeaderColumn struct {
	Column, Header string
}

// Type OIDs the decoder treats specially.
const (
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidJSON        = 114
	oidText        = 25
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// role is what a column of the outbox table means to an Event.
type role uint8

const (
	roleNone role = iota
	roleID
	roleAggregateID
	roleTopic
	rolePayload
	roleCreatedAt
	roleEventType
	roleHeaders
	numRoles
)

// relation is what the decoder remembers of a Relation message.
type relation struct {
	ncols  int
	outbox bool
	// The fields below are set for the outbox relation only.
	roles   []role // roles[i] is the role of column i
	names   []string
	oid     [numRoles]uint32
	missing error // *MissingColumnError, *ColumnTypeError or nil
	// tmpl[i] is the column of placeholder i of the topic template.
	tmpl []int
	// hdr[i] is the column of HeaderColumns[i].
	hdr []int
}

// Decoder turns pgoutput messages (protocol version 1, text format, no
// streaming) into outbox Messages. It keeps the relation cache and the
// transaction state of one replication stream and does no I/O. A Decoder is
// not safe for concurrent use.
type Decoder struct {
	schema, table string
	cols          Columns
	tmpl          *topicTemplate
	hdrCols       []HeaderColumn
	messages      bool
	nullPayload   bool
	verifier      *messageVerifier
	rels          map[uint32]*relation
	inTxn         bool
	// row holds the value spans of the outbox row being decoded.
	row      []span
	topicBuf []byte
	// interned holds recent topic and event type strings, so that an
	// Event's Topic and EventType do not allocate.
	interned                 map[string]string
	lastTopic, lastEventType string
}

// Bounds of the intern table.
const (
	maxInterned    = 256
	maxInternedLen = 256
)

// NewDecoder returns a Decoder for the outbox table described by cfg.
func NewDecoder(cfg DecoderConfig) *Decoder {
	d := &Decoder{
		schema:      or(cfg.Schema, "public"),
		table:       or(cfg.Table, "outbox"),
		cols:        cfg.columns(),
		hdrCols:     cfg.HeaderColumns,
		messages:    cfg.Messages,
		nullPayload: cfg.NullPayload,
		verifier:    newMessageVerifier(cfg.MessageKey),
		rels:        make(map[uint32]*relation),
		interned:    make(map[string]string),
	}
	// An invalid template is reported by Validate; here it routes nothing.
	d.tmpl, _ = parseTopicTemplate(cfg.TopicTemplate)
	return d
}

// Decode interprets one pgoutput message (XLogData.WALData). It updates the
// relation cache and the transaction state and returns what the message means
// for the outbox. Messages the outbox does not need (Update, Delete, Truncate,
// Type, Origin, logical decoding Message, Relation, rows of other tables)
// return KindNone. The returned Message never aliases walData. Decode leaves
// Message.WALStart zero: it is the caller's to set from XLogData.WALStart.
//
// A failed Decode leaves the transaction state as it was.
func (d *Decoder) Decode(walData []byte) (Message, error) {
	if len(walData) == 0 {
		return Message{}, &DecodeError{Err: ErrProtocol, Detail: "empty message"}
	}
	switch t := walData[0]; t {
	case 'B':
		return d.decodeBegin(walData)
	case 'C':
		return d.decodeCommit(walData)
	case 'R':
		return Message{}, d.decodeRelation(walData)
	case 'I':
		return d.decodeInsert(walData)
	case 'M':
		return d.decodeMessage(walData)
	case 'U', 'D', 'T', 'Y', 'O':
		return Message{}, nil
	case 'S', 'E', 'c', 'A':
		return Message{}, &DecodeError{MsgType: t, Err: ErrProtocol, Detail: "streaming of in-progress transactions is not enabled"}
	default:
		return Message{}, &DecodeError{MsgType: t, Err: ErrProtocol, Detail: fmt.Sprintf("unknown message type %q", t)}
	}
}

// Sizes of the fixed-size messages, type byte included.
const (
	beginSize  = 1 + 8 + 8 + 4
	commitSize = 1 + 1 + 8 + 8 + 8
)

func (d *Decoder) decodeBegin(b []byte) (Message, error) {
	if err := checkSize(b, beginSize); err != nil {
		return Message{}, err
	}
	if d.inTxn {
		return Message{}, protoErr(b, 0, "begin inside a transaction")
	}
	d.inTxn = true
	return Message{
		Kind: KindBegin,
		Begin: Begin{
			FinalLSN:   pglogrepl.LSN(binary.BigEndian.Uint64(b[1:])),
			CommitTime: pgTime(binary.BigEndian.Uint64(b[9:])),
			Xid:        binary.BigEndian.Uint32(b[17:]),
		},
	}, nil
}

func (d *Decoder) decodeCommit(b []byte) (Message, error) {
	if err := checkSize(b, commitSize); err != nil {
		return Message{}, err
	}
	if !d.inTxn {
		return Message{}, protoErr(b, 0, "commit outside a transaction")
	}
	d.inTxn = false
	// b[1] holds flags, unused by protocol version 1.
	return Message{
		Kind: KindCommit,
		Commit: Commit{
			CommitLSN:  pglogrepl.LSN(binary.BigEndian.Uint64(b[2:])),
			EndLSN:     pglogrepl.LSN(binary.BigEndian.Uint64(b[10:])),
			CommitTime: pgTime(binary.BigEndian.Uint64(b[18:])),
		},
	}, nil
}

// Minimum encoded size of one column of a Relation message: flags, an empty
// name's terminator, type OID, type modifier.
const minRelColumnSize = 1 + 1 + 4 + 4

func (d *Decoder) decodeRelation(b []byte) error {
	off := 1
	relID, off, err := readUint32(b, off)
	if err != nil {
		return err
	}
	ns, off, err := readCString(b, off)
	if err != nil {
		return err
	}
	name, off, err := readCString(b, off)
	if err != nil {
		return err
	}
	if off+1+2 > len(b) {
		return truncErr(b)
	}
	off++ // replica identity
	n := int(binary.BigEndian.Uint16(b[off:]))
	off += 2
	// Check the claimed column count against the bytes present before
	// allocating anything for it.
	if n*minRelColumnSize > len(b)-off {
		return protoErr(b, off-2, fmt.Sprintf("%d columns do not fit in the %d bytes left", n, len(b)-off))
	}
	rel := &relation{ncols: n}
	if string(ns) == d.schema && string(name) == d.table {
		rel.outbox = true
		rel.roles = make([]role, n)
		rel.names = make([]string, n)
	}
	var seen [numRoles]bool
	for i := 0; i < n; i++ {
		off++ // flags
		var col []byte
		if col, off, err = readCString(b, off); err != nil {
			return err
		}
		var oid uint32
		if oid, off, err = readUint32(b, off); err != nil {
			return err
		}
		if off+4 > len(b) {
			return truncErr(b)
		}
		off += 4 // type modifier
		if !rel.outbox {
			continue
		}
		rel.names[i] = string(col)
		if r := d.roleOf(col); r != roleNone && !seen[r] {
			seen[r] = true
			rel.roles[i] = r
			rel.oid[r] = oid
		}
	}
	if off != len(b) {
		return trailingErr(b, off)
	}
	if rel.outbox {
		rel.missing = d.resolve(rel, &seen)
	}
	d.rels[relID] = rel
	return nil
}

func (d *Decoder) roleOf(col []byte) role {
	switch string(col) {
	case d.cols.ID:
		return roleID
	case d.cols.AggregateID:
		return roleAggregateID
	case d.cols.Topic:
		return roleTopic
	case d.cols.Payload:
		return rolePayload
	case d.cols.CreatedAt:
		return roleCreatedAt
	case d.cols.EventType:
		return roleEventType
	case d.cols.Headers:
		return roleHeaders
	}
	return roleNone
}

// span locates one column value of a TupleData in walData.
type span struct {
	kind       byte // 'n', 't', 'u' or 'b'; 0 when the column is absent
	col        int
	start, end int
}

func (d *Decoder) decodeInsert(b []byte) (Message, error) {
	if !d.inTxn {
		return Message{}, protoErr(b, 0, "insert outside a transaction")
	}
	off := 1
	relID, off, err := readUint32(b, off)
	if err != nil {
		return Message{}, err
	}
	if off+1+2 > len(b) {
		return Message{}, truncErr(b)
	}
	if b[off] != 'N' {
		return Message{}, protoErr(b, off, fmt.Sprintf("tuple type %q, want 'N'", b[off]))
	}
	off++
	n := int(binary.BigEndian.Uint16(b[off:]))
	rel := d.rels[relID]
	if rel == nil {
		return Message{}, &DecodeError{MsgType: 'I', Offset: 1, Err: ErrUnknownRelation, Detail: fmt.Sprintf("no Relation message for relation id %d", relID)}
	}
	if n != rel.ncols {
		return Message{}, protoErr(b, off, fmt.Sprintf("tuple has %d columns, relation %d has %d", n, relID, rel.ncols))
	}
	off += 2

	var spans [numRoles]span
	odd := span{col: -1} // first 'u' or 'b' value
	if rel.outbox {
		if cap(d.row) < n {
			d.row = make([]span, n)
		}
		d.row = d.row[:n]
	}
	for i := 0; i < n; i++ {
		if off >= len(b) {
			return Message{}, truncErr(b)
		}
		s := span{kind: b[off], col: i}
		switch s.kind {
		case 'n', 'u':
			s.start, s.end = off, off
			off++
		case 't', 'b':
			var l uint32
			if l, off, err = readUint32(b, off+1); err != nil {
				return Message{}, err
			}
			if uint64(l) > uint64(len(b)-off) {
				return Message{}, protoErr(b, off-4, fmt.Sprintf("value of column %d claims %d bytes, %d left", i, l, len(b)-off))
			}
			s.start, s.end = off, off+int(l)
			off = s.end
		default:
			return Message{}, protoErr(b, off, fmt.Sprintf("unknown tuple value kind %q in column %d", s.kind, i))
		}
		if !rel.outbox {
			continue
		}
		if (s.kind == 'u' || s.kind == 'b') && odd.col < 0 {
			odd = s
		}
		d.row[i] = s
		if r := rel.roles[i]; r != roleNone {
			spans[r] = s
		}
	}
	if off != len(b) {
		return Message{}, trailingErr(b, off)
	}
	if !rel.outbox {
		return Message{}, nil
	}
	if rel.missing != nil {
		return Message{}, rel.missing
	}
	return d.event(b, rel, &spans, odd)
}

// event builds the Event of an outbox row whose values spans locate in b.
func (d *Decoder) event(b []byte, rel *relation, spans *[numRoles]span, odd span) (Message, error) {
	var ev Event
	idKnown := false
	badValue := func(s span, detail string) error {
		row := "outbox row: "
		if idKnown {
			row = "outbox row id=" + ev.IDString() + ": "
		}
		id := ""
		if idKnown {
			id = ev.IDString()
		}
		return &DecodeError{MsgType: 'I', Offset: s.start, Err: ErrBadValue,
			Detail: fmt.Sprintf("%scolumn %q %s", row, rel.names[s.col], detail), bad: d.badRow(b, rel, id)}
	}
	// required returns the text value of a required column.
	required := func(s span) ([]byte, error) {
		switch s.kind {
		case 't':
			return b[s.start:s.end], nil
		case 'n':
			return nil, badValue(s, "is NULL")
		default:
			return nil, badValue(s, kindDetail(s.kind))
		}
	}

	v, err := required(spans[roleID])
	if err != nil {
		return Message{}, err
	}
	var ok bool
	if rel.oid[roleID] == oidUUID {
		ev.UUID = string(v)
	} else if ev.ID, ok = parseInt64(v); !ok {
		return Message{}, badValue(spans[roleID], "is not an integer: "+quote(v))
	}
	idKnown = true
	if odd.col >= 0 {
		return Message{}, badValue(odd, kindDetail(odd.kind))
	}

	if v, err = required(spans[roleAggregateID]); err != nil {
		return Message{}, err
	}
	ev.AggregateID = string(v)

	s := spans[rolePayload]
	switch v, err = required(s); {
	case s.kind == 'n' && d.nullPayload:
		// ev.Payload stays nil: a tombstone.
	case err != nil:
		return Message{}, err
	case rel.oid[rolePayload] == oidBytea:
		if ev.Payload, ok = decodeByteaHex(v); !ok {
			return Message{}, badValue(s, "is not bytea in hex format: "+quote(v))
		}
	default:
		ev.Payload = make([]byte, len(v))
		copy(ev.Payload, v)
	}

	if s := spans[roleTopic]; s.kind == 't' {
		ev.Topic = d.intern(b[s.start:s.end], &d.lastTopic)
	}
	if d.tmpl != nil {
		ev.Topic = d.renderTopic(b, rel)
	}
	if s := spans[roleEventType]; s.kind == 't' {
		ev.EventType = d.intern(b[s.start:s.end], &d.lastEventType)
	}
	if s := spans[roleCreatedAt]; s.kind == 't' {
		v := b[s.start:s.end]
		switch rel.oid[roleCreatedAt] {
		case oidInt8, oidInt4:
			ms, ok := parseInt64(v)
			if !ok {
				return Message{}, badValue(s, "is not an integer: "+quote(v))
			}
			ev.CreatedAt = time.UnixMilli(ms).UTC()
		default:
			if ev.CreatedAt, ok = parseTimestamp(v); !ok {
				return Message{}, badValue(s, "is not an ISO timestamp: "+quote(v))
			}
		}
	}
	for i, c := range rel.hdr {
		if s := d.row[c]; s.kind == 't' {
			ev.Headers = append(ev.Headers, Header{Key: d.hdrCols[i].Header, Value: string(b[s.start:s.end])})
		}
	}
	if s := spans[roleHeaders]; s.kind == 't' {
		v := b[s.start:s.end]
		if ev.Headers, ok = appendJSONHeaders(ev.Headers, v); !ok {
			return Message{}, badValue(s, "is not a JSON object of string values: "+quote(v))
		}
	}
	return Message{Kind: KindEvent, Event: ev}, nil
}

// intern returns v as a string, reusing an earlier string with the same
// bytes when there is one: *last (the previous value of the same column)
// or one in the intern table.
func (d *Decoder) intern(v []byte, last *string) string {
	if string(v) == *last {
		return *last
	}
	s, ok := d.interned[string(v)]
	if !ok {
		s = string(v)
		if len(d.interned) < maxInterned && len(s) <= maxInternedLen {
			d.interned[s] = s
		}
	}
	*last = s
	return s
}

func kindDetail(kind byte) string {
	switch kind {
	case 'u':
		return "is an unchanged TOAST value, which an insert cannot carry"
	case 'b':
		return "is in binary format; the stream must use text format"
	}
	return fmt.Sprintf("has value kind %q", kind)
}

// readUint32 reads a big-endian uint32 at off.
func readUint32(b []byte, off int) (uint32, int, error) {
	if off+4 > len(b) {
		return 0, off, truncErr(b)
	}
	return binary.BigEndian.Uint32(b[off:]), off + 4, nil
}

// readCString reads a NUL-terminated string at off; the result excludes the
// NUL and aliases b.
func readCString(b []byte, off int) ([]byte, int, error) {
	if off > len(b) {
		return nil, off, truncErr(b)
	}
	for i := off; i < len(b); i++ {
		if b[i] == 0 {
			return b[off:i], i + 1, nil
		}
	}
	return nil, off, protoErr(b, off, "string is not NUL-terminated")
}

func checkSize(b []byte, size int) error {
	if len(b) < size {
		return truncErr(b)
	}
	if len(b) > size {
		return trailingErr(b, size)
	}
	return nil
}

func protoErr(b []byte, off int, detail string) error {
	return &DecodeError{MsgType: b[0], Offset: off, Err: ErrProtocol, Detail: detail}
}

func truncErr(b []byte) error {
	return protoErr(b, len(b), fmt.Sprintf("message truncated after %d bytes", len(b)))
}

func trailingErr(b []byte, off int) error {
	return protoErr(b, off, fmt.Sprintf("%d trailing bytes", len(b)-off))
}

func msgTypeName(t byte) string {
	switch t {
	case 'B':
		return "Begin"
	case 'C':
		return "Commit"
	case 'R':
		return "Relation"
	case 'I':
		return "Insert"
	case 'M':
		return "Message"
	case 'S':
		return "StreamStart"
	case 'E':
		return "StreamStop"
	case 'c':
		return "StreamCommit"
	case 'A':
		return "StreamAbort"
	}
	return fmt.Sprintf("unknown (%q)", t)
}

// quote quotes v for an error message, cut to a readable length.
func quote(v []byte) string {
	const max = 64
	if len(v) > max {
		return strconv.Quote(string(v[:max])) + "..."
	}
	return strconv.Quote(string(v))
}

// Seconds from the Unix epoch to the Postgres epoch, 2000-01-01 00:00 UTC.
const pgEpochUnix = 946684800

// pgTime converts microseconds since the Postgres epoch to a UTC time.
func pgTime(u uint64) time.Time {
	us := int64(u)
	return time.Unix(pgEpochUnix+us/1e6, (us%1e6)*1e3).UTC()
}

// parseInt64 parses the text form of an int2, int4 or int8.
func parseInt64(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	limit := uint64(1<<63 - 1)
	if neg {
		limit++
	}
	var u uint64
	for _, c := range b {
		c -= '0'
		if c > 9 {
			return 0, false
		}
		u = u*10 + uint64(c) // cannot overflow uint64 with at most 19 digits
	}
	if u > limit {
		return 0, false
	}
	if neg {
		return -int64(u-1) - 1, true
	}
	return int64(u), true
}

// decodeByteaHex decodes bytea's hex output format, `\x` followed by two hex
// digits per byte.
func decodeByteaHex(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' || len(v)%2 != 0 {
		return nil, false
	}
	out := make([]byte, (len(v)-2)/2)
	if _, err := hex.Decode(out, v[2:]); err != nil {
		return nil, false
	}
	return out, true
}

// parseTimestamp parses the ISO text output (DateStyle ISO) of a timestamptz,
// `2006-01-02 15:04:05[.999999]±07[:00[:00]]`, or of a timestamp, which has
// no offset and is taken as UTC. BC dates and infinities are not accepted.
func parseTimestamp(b []byte) (time.Time, bool) {
	year, i, ok := digits(b, 0, 4, 9)
	if !ok || year < 1 || !sep(b, i, '-') {
		return time.Time{}, false
	}
	month, i, ok := digits(b, i+1, 2, 2)
	if !ok || month < 1 || month > 12 || !sep(b, i, '-') {
		return time.Time{}, false
	}
	day, i, ok := digits(b, i+1, 2, 2)
	if !ok || day < 1 || day > daysIn(month, year) || !sep(b, i, ' ') {
		return time.Time{}, false
	}
	hour, i, ok := digits(b, i+1, 2, 2)
	if !ok || hour > 23 || !sep(b, i, ':') {
		return time.Time{}, false
	}
	minute, i, ok := digits(b, i+1, 2, 2)
	if !ok || minute > 59 || !sep(b, i, ':') {
		return time.Time{}, false
	}
	sec, i, ok := digits(b, i+1, 2, 2)
	if !ok || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	if sep(b, i, '.') {
		start := i + 1
		if nsec, i, ok = digits(b, start, 1, 9); !ok {
			return time.Time{}, false
		}
		for n := i - start; n < 9; n++ {
			nsec *= 10
		}
	}
	offset := 0
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		sign := 1
		if b[i] == '-' {
			sign = -1
		}
		var h, m, s int
		if h, i, ok = digits(b, i+1, 2, 2); !ok || h > 15 {
			return time.Time{}, false
		}
		if sep(b, i, ':') {
			if m, i, ok = digits(b, i+1, 2, 2); !ok || m > 59 {
				return time.Time{}, false
			}
			if sep(b, i, ':') {
				if s, i, ok = digits(b, i+1, 2, 2); !ok || s > 59 {
					return time.Time{}, false
				}
			}
		}
		offset = sign * (h*3600 + m*60 + s)
	}
	if i != len(b) {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

// digits reads between min and max decimal digits at i.
func digits(b []byte, i, min, max int) (int, int, bool) {
	v, start := 0, i
	for ; i < len(b) && i-start < max; i++ {
		c := b[i] - '0'
		if c > 9 {
			break
		}
		v = v*10 + int(c)
	}
	return v, i, i-start >= min
}

func sep(b []byte, i int, c byte) bool { return i < len(b) && b[i] == c }

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
