package replication

import (
	"fmt"
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
	reservedHdrs  []string
	messages      bool
	nullPayload   bool
	verifier      *messageVerifier
	// streamed holds the checks of outboxd messages too large to hold
	// that the frame filter read (nil: none are streamed).
	streamed *streamedMessages
	rels     map[uint32]*relation
	inTxn    bool
	xid      uint32 // of the transaction in hand (inTxn)
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
		schema:       or(cfg.Schema, "public"),
		table:        or(cfg.Table, "outbox"),
		cols:         cfg.columns(),
		hdrCols:      cfg.HeaderColumns,
		reservedHdrs: cfg.ReservedHeaders,
		messages:     cfg.Messages,
		nullPayload:  cfg.NullPayload,
		verifier:     newMessageVerifier(cfg.MessageKey),
		rels:         make(map[uint32]*relation),
		interned:     make(map[string]string),
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

func (d *Decoder) decodeBegin(b []byte) (Message, error) {
	var m beginMessage
	if err := m.decode(b); err != nil {
		return Message{}, err
	}
	if d.inTxn {
		return Message{}, protoErr(b, 0, "begin inside a transaction")
	}
	d.inTxn, d.xid = true, m.xid
	return Message{Kind: KindBegin, Begin: Begin{FinalLSN: m.finalLSN, CommitTime: m.commitTime, Xid: m.xid}}, nil
}

func (d *Decoder) decodeCommit(b []byte) (Message, error) {
	var m commitMessage
	if err := m.decode(b); err != nil {
		return Message{}, err
	}
	if !d.inTxn {
		return Message{}, protoErr(b, 0, "commit outside a transaction")
	}
	d.inTxn = false
	return Message{Kind: KindCommit, Commit: Commit{CommitLSN: m.commitLSN, EndLSN: m.endLSN, CommitTime: m.commitTime}}, nil
}

// decodeRelation remembers a relation; for the outbox table, the role and
// type of each column.
func (d *Decoder) decodeRelation(b []byte) error {
	var m relationMessage
	if err := m.decode(b); err != nil {
		return err
	}
	n := len(m.columns)
	rel := &relation{ncols: n}
	if string(m.namespace) == d.schema && string(m.name) == d.table {
		rel.outbox = true
		rel.roles = make([]role, n)
		rel.names = make([]string, n)
		var seen [numRoles]bool
		for i, c := range m.columns {
			rel.names[i] = string(c.name)
			if r := d.roleOf(c.name); r != roleNone && !seen[r] {
				seen[r] = true
				rel.roles[i] = r
				rel.oid[r] = c.typeOID
			}
		}
		rel.missing = d.resolve(rel, &seen)
	}
	d.rels[m.relID] = rel
	return nil
}

// decodeInsert turns an Insert of the outbox table into an event; inserts
// of other tables mean nothing.
func (d *Decoder) decodeInsert(b []byte) (Message, error) {
	if !d.inTxn {
		return Message{}, protoErr(b, 0, "insert outside a transaction")
	}
	var m insertMessage
	if err := m.decodeHeader(b); err != nil {
		return Message{}, err
	}
	rel := d.rels[m.relID]
	if rel == nil {
		return Message{}, &DecodeError{MsgType: 'I', Offset: 1, Err: ErrUnknownRelation, Detail: fmt.Sprintf("no Relation message for relation id %d", m.relID)}
	}
	if m.ncols != rel.ncols {
		return Message{}, protoErr(b, m.ncolsOff, fmt.Sprintf("tuple has %d columns, relation %d has %d", m.ncols, m.relID, rel.ncols))
	}
	var row []span // nil: the values are checked, not kept
	if rel.outbox {
		if cap(d.row) < m.ncols {
			d.row = make([]span, m.ncols)
		}
		d.row = d.row[:m.ncols]
		row = d.row
	}
	if err := m.decodeTuple(b, row); err != nil {
		return Message{}, err
	}
	if !rel.outbox {
		return Message{}, nil
	}
	if rel.missing != nil {
		return Message{}, rel.missing
	}
	var spans [numRoles]span
	odd := span{col: -1} // first 'u' or 'b' value
	for i, s := range row {
		if (s.kind == 'u' || s.kind == 'b') && odd.col < 0 {
			odd = s
		}
		if r := rel.roles[i]; r != roleNone {
			spans[r] = s
		}
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
