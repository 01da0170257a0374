package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// ---- encoders: pgoutput protocol version 1 ----

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

func encodeRelation(relID uint32, namespace, name string, cols ...column) []byte {
	b := []byte{'R'}
	b = binary.BigEndian.AppendUint32(b, relID)
	b = append(append(b, namespace...), 0)
	b = append(append(b, name...), 0)
	b = append(b, 'd') // replica identity default
	b = binary.BigEndian.AppendUint16(b, uint16(len(cols)))
	for i, c := range cols {
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

// value is one TupleData column: kind 'n', 'u', 't' or 'b'.
type value struct {
	kind byte
	data string
}

func txt(s string) value { return value{'t', s} }

var (
	null  = value{kind: 'n'}
	toast = value{kind: 'u'}
)

func encodeTuple(b []byte, vals ...value) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(vals)))
	for _, v := range vals {
		b = append(b, v.kind)
		if v.kind == 't' || v.kind == 'b' {
			b = binary.BigEndian.AppendUint32(b, uint32(len(v.data)))
			b = append(b, v.data...)
		}
	}
	return b
}

func encodeInsert(relID uint32, vals ...value) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'I'}, relID)
	return encodeTuple(append(b, 'N'), vals...)
}

func encodeUpdate(relID uint32, vals ...value) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'U'}, relID)
	return encodeTuple(append(b, 'N'), vals...)
}

func encodeDelete(relID uint32, key ...value) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'D'}, relID)
	return encodeTuple(append(b, 'K'), key...)
}

func encodeTruncate(relIDs ...uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'T'}, uint32(len(relIDs)))
	b = append(b, 0)
	for _, id := range relIDs {
		b = binary.BigEndian.AppendUint32(b, id)
	}
	return b
}

func encodeType(oid uint32, namespace, name string) []byte {
	b := binary.BigEndian.AppendUint32([]byte{'Y'}, oid)
	b = append(append(b, namespace...), 0)
	return append(append(b, name...), 0)
}

func encodeOrigin(lsn pglogrepl.LSN, name string) []byte {
	b := binary.BigEndian.AppendUint64([]byte{'O'}, uint64(lsn))
	return append(append(b, name...), 0)
}

func encodeMessage(transactional bool, lsn pglogrepl.LSN, prefix string, content []byte) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// ---- fixtures ----

const (
	outboxRel = 16385
	otherRel  = 16394
)

var (
	commitTime = time.Date(2026, 11, 29, 9, 21, 44, 123456000, time.UTC)
	createdAt  = time.Date(2026, 11, 29, 9, 21, 40, 5000, time.UTC)
)

// outboxColumns is the standard outbox table.
var outboxColumns = []column{
	{"id", oidInt8},
	{"aggregate_id", oidText},
	{"topic", oidText},
	{"payload", oidJSONB},
	{"created_at", oidTimestamptz},
	{"event_type", oidText},
}

func outboxRelation() []byte {
	return encodeRelation(outboxRel, "public", "outbox", outboxColumns...)
}

func outboxInsert(id int64, agg string) []byte {
	return encodeInsert(outboxRel,
		txt(strconv.FormatInt(id, 10)), txt(agg), txt("orders"),
		txt(`{"order": 42, "items": [1, 2]}`), txt("2026-11-29 09:21:40.000005+00"), txt("OrderCreated"))
}

func outboxEvent(id int64, agg string) Event {
	return Event{ID: id, AggregateID: agg, Topic: "orders",
		Payload: []byte(`{"order": 42, "items": [1, 2]}`), EventType: "OrderCreated", CreatedAt: createdAt}
}

func begin(xid uint32) []byte { return encodeBegin(0x153B4F8, commitTime, xid) }
func commit() []byte          { return encodeCommit(0x153B4F8, 0x153B528, commitTime) }

// decodeAll feeds msgs to d and fails the test on the first error.
func decodeAll(t *testing.T, d *Decoder, msgs ...[]byte) []Message {
	t.Helper()
	var out []Message
	for i, m := range msgs {
		got, err := d.Decode(m)
		if err != nil {
			t.Fatalf("message %d (%q): %v", i, m[0], err)
		}
		out = append(out, got)
	}
	return out
}

// diffMessage describes how got differs from want, or returns "".
func diffMessage(got, want Message) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w)) }
	if got.Kind != want.Kind {
		add("Kind", got.Kind, want.Kind)
	}
	if got.Begin.Xid != want.Begin.Xid || got.Begin.FinalLSN != want.Begin.FinalLSN || !got.Begin.CommitTime.Equal(want.Begin.CommitTime) {
		add("Begin", got.Begin, want.Begin)
	}
	if got.Commit.CommitLSN != want.Commit.CommitLSN || got.Commit.EndLSN != want.Commit.EndLSN || !got.Commit.CommitTime.Equal(want.Commit.CommitTime) {
		add("Commit", got.Commit, want.Commit)
	}
	if s := diffEvent(got.Event, want.Event); s != "" {
		d = append(d, s)
	}
	return strings.Join(d, "; ")
}

func diffEvent(got, want Event) string {
	var d []string
	add := func(field string, g, w any) { d = append(d, fmt.Sprintf("Event.%s = %q, want %q", field, g, w)) }
	if got.ID != want.ID {
		d = append(d, fmt.Sprintf("Event.ID = %d, want %d", got.ID, want.ID))
	}
	if got.AggregateID != want.AggregateID {
		add("AggregateID", got.AggregateID, want.AggregateID)
	}
	if got.Topic != want.Topic {
		add("Topic", got.Topic, want.Topic)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		add("Payload", got.Payload, want.Payload)
	}
	if got.EventType != want.EventType {
		add("EventType", got.EventType, want.EventType)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) {
		d = append(d, fmt.Sprintf("Event.CreatedAt = %v, want %v", got.CreatedAt, want.CreatedAt))
	}
	if got.UUID != want.UUID {
		add("UUID", got.UUID, want.UUID)
	}
	if fmt.Sprint(got.Headers) != fmt.Sprint(want.Headers) {
		d = append(d, fmt.Sprintf("Event.Headers = %q, want %q", got.Headers, want.Headers))
	}
	return strings.Join(d, "; ")
}
