package sim

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// pgoutput protocol version 1 messages, laid out as pglogrepl's message.go
// reads them. The replication package's own encoders are test files; these
// are the few the walsender needs.

// PostgreSQL type OIDs of the outbox table's columns.
const (
	oidInt8        = 20
	oidText        = 25
	oidTimestamptz = 1184
	oidJSONB       = 3802
)

// outboxRelID is the relation id of public.outbox in the scripted WAL.
const outboxRelID = 16385

// pgEpochUnix is 2000-01-01 00:00:00 UTC, where PostgreSQL's clock starts.
const pgEpochUnix = 946684800

func pgMicros(t time.Time) uint64 {
	return uint64((t.Unix()-pgEpochUnix)*1e6 + int64(t.Nanosecond()/1e3))
}

func encodeBegin(finalLSN pglogrepl.LSN, commitTime time.Time, xid uint32) []byte {
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, uint64(finalLSN))
	b = binary.BigEndian.AppendUint64(b, pgMicros(commitTime))
	return binary.BigEndian.AppendUint32(b, xid)
}

func encodeCommit(commitLSN, endLSN pglogrepl.LSN, commitTime time.Time) []byte {
	b := []byte{'C', 0}
	b = binary.BigEndian.AppendUint64(b, uint64(commitLSN))
	b = binary.BigEndian.AppendUint64(b, uint64(endLSN))
	return binary.BigEndian.AppendUint64(b, pgMicros(commitTime))
}

type column struct {
	name string
	oid  uint32
}

// outboxColumns is outboxd's own outbox table (migrations/001_outbox.sql),
// without the optional headers column.
var outboxColumns = []column{
	{"id", oidInt8},
	{"aggregate_id", oidText},
	{"topic", oidText},
	{"payload", oidJSONB},
	{"created_at", oidTimestamptz},
	{"event_type", oidText},
}

func encodeRelation() []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, outboxRelID)
	b = append(append(b, "public"...), 0)
	b = append(append(b, "outbox"...), 0)
	b = append(b, 'd') // replica identity default
	b = binary.BigEndian.AppendUint16(b, uint16(len(outboxColumns)))
	for i, c := range outboxColumns {
		flags := byte(0)
		if i == 0 {
			flags = 1 // part of the key
		}
		b = append(b, flags)
		b = append(append(b, c.name...), 0)
		b = binary.BigEndian.AppendUint32(b, c.oid)
		b = binary.BigEndian.AppendUint32(b, 0xffffffff) // typmod -1
	}
	return b
}

func encodeInsert(r Row) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, outboxRelID)
	b = append(b, 'N')
	vals := []string{
		strconv.FormatInt(r.ID, 10), r.Key, r.Topic, r.Payload,
		"2026-11-29 09:21:40.000005+00", "SimEvent",
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

func xlogData(start pglogrepl.LSN, walData []byte) []byte {
	b := []byte{pglogrepl.XLogDataByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	b = binary.BigEndian.AppendUint64(b, uint64(start)+uint64(len(walData)))
	b = binary.BigEndian.AppendUint64(b, pgMicros(time.Now()))
	return append(b, walData...)
}

func keepalive(walEnd pglogrepl.LSN, replyRequested bool) []byte {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walEnd))
	b = binary.BigEndian.AppendUint64(b, pgMicros(time.Now()))
	if replyRequested {
		return append(b, 1)
	}
	return append(b, 0)
}
