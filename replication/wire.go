package replication

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// The pgoutput messages the decoder reads (protocol version 1, text
// format), one type each, as their bytes say and nothing more: what they
// mean for the outbox is the Decoder's (decoder.go, row.go). Each decode
// checks the framing and returns a *DecodeError wrapping ErrProtocol for a
// malformed message; byte slices alias walData.

// Sizes of the fixed-size messages, type byte included.
const (
	beginSize  = 1 + 8 + 8 + 4
	commitSize = 1 + 1 + 8 + 8 + 8
)

// beginMessage is a Begin ('B'): a committed transaction starts.
type beginMessage struct {
	finalLSN   pglogrepl.LSN // the transaction's commit record
	commitTime time.Time
	xid        uint32
}

func (m *beginMessage) decode(b []byte) error {
	if err := checkSize(b, beginSize); err != nil {
		return err
	}
	m.finalLSN = pglogrepl.LSN(binary.BigEndian.Uint64(b[1:]))
	m.commitTime = pgTime(binary.BigEndian.Uint64(b[9:]))
	m.xid = binary.BigEndian.Uint32(b[17:])
	return nil
}

// commitMessage is a Commit ('C'): the transaction ends.
type commitMessage struct {
	commitLSN, endLSN pglogrepl.LSN
	commitTime        time.Time
}

func (m *commitMessage) decode(b []byte) error {
	if err := checkSize(b, commitSize); err != nil {
		return err
	}
	// b[1] holds flags, unused by protocol version 1.
	m.commitLSN = pglogrepl.LSN(binary.BigEndian.Uint64(b[2:]))
	m.endLSN = pglogrepl.LSN(binary.BigEndian.Uint64(b[10:]))
	m.commitTime = pgTime(binary.BigEndian.Uint64(b[18:]))
	return nil
}

// relationMessage is a Relation ('R'): a table's id, name and columns, sent
// before the first row of it in a session and after it changed.
type relationMessage struct {
	relID           uint32
	namespace, name []byte
	columns         []relationColumn
}

// relationColumn is one column of a Relation message.
type relationColumn struct {
	name    []byte
	typeOID uint32
}

// Minimum encoded size of one column of a Relation message: flags, an empty
// name's terminator, type OID, type modifier.
const minRelColumnSize = 1 + 1 + 4 + 4

func (m *relationMessage) decode(b []byte) error {
	off := 1
	var err error
	if m.relID, off, err = readUint32(b, off); err != nil {
		return err
	}
	if m.namespace, off, err = readCString(b, off); err != nil {
		return err
	}
	if m.name, off, err = readCString(b, off); err != nil {
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
	m.columns = make([]relationColumn, n)
	for i := range m.columns {
		c := &m.columns[i]
		off++ // flags
		if c.name, off, err = readCString(b, off); err != nil {
			return err
		}
		if c.typeOID, off, err = readUint32(b, off); err != nil {
			return err
		}
		if off+4 > len(b) {
			return truncErr(b)
		}
		off += 4 // type modifier
	}
	if off != len(b) {
		return trailingErr(b, off)
	}
	return nil
}

// insertMessage is an Insert ('I'): a new row of a relation. Its header is
// decoded first (decodeHeader), so that the relation is known before its
// values are (decodeTuple).
type insertMessage struct {
	relID    uint32
	ncols    int
	ncolsOff int // offset of the column count
}

func (m *insertMessage) decodeHeader(b []byte) error {
	var err error
	off := 1
	if m.relID, off, err = readUint32(b, off); err != nil {
		return err
	}
	if off+1+2 > len(b) {
		return truncErr(b)
	}
	if b[off] != 'N' {
		return protoErr(b, off, fmt.Sprintf("tuple type %q, want 'N'", b[off]))
	}
	off++
	m.ncols = int(binary.BigEndian.Uint16(b[off:]))
	m.ncolsOff = off
	return nil
}

// decodeTuple locates the row's values (TupleData) in b: into row[i] for
// column i, or only checked when row is nil.
func (m *insertMessage) decodeTuple(b []byte, row []span) error {
	off := m.ncolsOff + 2
	for i := 0; i < m.ncols; i++ {
		if off >= len(b) {
			return truncErr(b)
		}
		s := span{kind: b[off], col: i}
		switch s.kind {
		case 'n', 'u':
			s.start, s.end = off, off
			off++
		case 't', 'b':
			l, next, err := readUint32(b, off+1)
			if err != nil {
				return err
			}
			off = next
			if uint64(l) > uint64(len(b)-off) {
				return protoErr(b, off-4, fmt.Sprintf("value of column %d claims %d bytes, %d left", i, l, len(b)-off))
			}
			s.start, s.end = off, off+int(l)
			off = s.end
		default:
			return protoErr(b, off, fmt.Sprintf("unknown tuple value kind %q in column %d", s.kind, i))
		}
		if row != nil {
			row[i] = s
		}
	}
	if off != len(b) {
		return trailingErr(b, off)
	}
	return nil
}

// span locates one column value of a TupleData in walData.
type span struct {
	kind       byte // 'n', 't', 'u' or 'b'; 0 when the column is absent
	col        int
	start, end int
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

// Seconds from the Unix epoch to the Postgres epoch, 2000-01-01 00:00 UTC.
const pgEpochUnix = 946684800

// pgTime converts microseconds since the Postgres epoch to a UTC time.
func pgTime(u uint64) time.Time {
	us := int64(u)
	return time.Unix(pgEpochUnix+us/1e6, (us%1e6)*1e3).UTC()
}

// logicalMessage is a logical decoding Message ('M'), as
// pg_logical_emit_message wrote it.
type logicalMessage struct {
	transactional   bool
	lsn             pglogrepl.LSN
	prefix, content []byte
}

func (m *logicalMessage) decode(b []byte) error {
	const head = 1 + 1 + 8 // type, flags, LSN
	if len(b) < head {
		return truncErr(b)
	}
	m.transactional = b[1]&1 != 0
	m.lsn = pglogrepl.LSN(binary.BigEndian.Uint64(b[2:]))
	var off int
	var err error
	if m.prefix, off, err = readCString(b, head); err != nil {
		return err
	}
	n, off, err := readUint32(b, off)
	if err != nil {
		return err
	}
	if uint64(n) != uint64(len(b)-off) {
		return protoErr(b, off-4, fmt.Sprintf("content claims %d bytes, %d present", n, len(b)-off))
	}
	m.content = b[off:]
	return nil
}
