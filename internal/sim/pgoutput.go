package sim

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/replication"
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
	for i, v := range vals {
		if i == 2 && v == "" { // a NULL topic
			b = append(b, 'n')
			continue
		}
		b = append(b, 't')
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b
}

// The key outbox_emit signs with in the scripted database, the next one a
// rotation would install, and the key a forger signs with: any key but
// outbox_emit's.
var (
	emitKey     = []byte("sim: the key of outbox_emit_key.")
	nextEmitKey = []byte("sim: the next key of the rotation")
	forgerKey   = []byte("sim: a key that is not outbox_emit's")
)

// hmacPad is HMAC's inner or outer pad of a short key, as
// outbox_emit_pad computes it.
func hmacPad(key []byte, pad byte) []byte {
	b := bytes.Repeat([]byte{pad}, 64)
	for i, c := range key {
		b[i] = c ^ pad
	}
	return b
}

// emitContent is what outbox_emit writes for r in the transaction of full
// id xid, signed with key: format v3 (replication.MessagePrefix's layout).
func emitContent(r Row, xid uint64, key []byte) []byte {
	headers := "{}"
	if r.Kind == RowBadEmit {
		headers = `{"outbox-id": "42"}`
	}
	signed := fmt.Sprintf("%d:%d:%s%d:%s%d:%s%s", xid, len(r.Topic), r.Topic, len(r.Key), r.Key, len(headers), headers, r.Payload)
	m := hmac.New(sha256.New, key)
	m.Write([]byte("v3:"))
	m.Write([]byte(signed))
	return []byte("v3:" + hex.EncodeToString(m.Sum(nil)) + ":" + signed)
}

// encodeMessage is the transactional logical decoding message of r (a
// message kind) at lsn in the transaction xid.
func encodeMessage(lsn pglogrepl.LSN, r Row, xid uint32) []byte {
	prefix, content := replication.MessagePrefix, []byte(nil)
	switch r.Kind {
	case RowEmit, RowBadEmit, RowBigEmit:
		content = emitContent(r, uint64(xid), emitKey)
	case RowForged:
		content = emitContent(r, uint64(xid), forgerKey)
	case RowReplayed:
		// What outbox_emit wrote for the same event in an earlier
		// transaction, emitted again.
		content = emitContent(r, uint64(xid)-1-uint64(len(r.Key)), emitKey)
	default:
		prefix, content = "app.audit", []byte(r.Payload)
	}
	b := []byte{'M', 1}
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
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
