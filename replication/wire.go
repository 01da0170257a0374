package replication

import (
	"encoding/binary"
	"fmt"
	"time"
)

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
