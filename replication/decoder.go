package replication

import (
	"encoding/binary"
	"fmt"

	"github.com/jackc/pglogrepl"
)

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
