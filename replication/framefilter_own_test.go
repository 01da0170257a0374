package replication

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
)

// ownCase is an outboxd message of the streamed-message tests and what
// the whole-content decoder makes of it.
type ownCase struct {
	name   string
	msg    []byte
	kind   Kind
	reason string // KindRejected's
}

// bigOwnCases are outboxd messages of about 100 KB, every kind the
// verifier tells apart, with rotatedKey's keys, in transaction testXid.
func bigOwnCases() []ownCase {
	pad := `{"pad": "` + strings.Repeat("x", 100_000) + `"}`
	good := fieldsOf("orders", "order-7", `{"h": "v"}`, pad)
	v3 := func(key []byte, xid uint64) []byte { return signedV3(key, xid, good) }
	tampered := v3(rotatedKey.Key, testXid)
	tampered[len(tampered)-3] = 'y' // far past anything held: only the streamed MAC sees it
	longXid := signedAs("v3:", rotatedKey.Key, strings.Repeat("1", 25)+":"+good)
	m := func(lsn pglogrepl.LSN, c []byte) []byte { return encodeMessage(true, lsn, MessagePrefix, c) }
	return []ownCase{
		{"authentic, signing key", m(0x4000, v3(rotatedKey.Key, testXid)), KindEvent, ""},
		{"authentic, next key", m(0x4010, v3(rotatedKey.Next, testXid)), KindEvent, ""},
		{"authentic, previous key", m(0x4020, v3(rotatedKey.Previous, testXid)), KindEvent, ""},
		{"authentic, fields do not parse", m(0x4030, signedV3(rotatedKey.Key, testXid, "x"+pad)), KindBad, ""},
		{"forged", m(0x4040, v3(bytes.Repeat([]byte{7}, 32), testXid)), KindRejected, RejectBadMAC},
		{"tampered at the end", m(0x4050, tampered), KindRejected, RejectBadMAC},
		{"replayed", m(0x4060, v3(rotatedKey.Key, testXid+1)), KindRejected, RejectReplayed},
		{"xid too long", m(0x4070, longXid), KindRejected, RejectMalformed},
		{"xid not a number", m(0x4080, signedAs("v3:", rotatedKey.Key, "x:"+good)), KindRejected, RejectMalformed},
		{"v3 without MAC", m(0x4090, []byte("v3:1:"+good)), KindRejected, RejectMalformed},
		{"v2 before v3", m(0x2000, signed(rotatedKey.Key, good)), KindEvent, ""},
		{"v2 after v3", m(0x40A0, signed(rotatedKey.Key, good)), KindRejected, RejectUnboundV2},
		{"v2 forged", m(0x2010, signed([]byte{1}, good)), KindRejected, RejectBadMAC},
		{"v1 before the key", m(0x800, []byte("v1:"+good)), KindEvent, ""},
		{"v1 after the key", m(0x40B0, []byte("v1:"+good)), KindRejected, RejectUnauthenticated},
		{"unknown format", m(0x40C0, []byte("v9:"+good)), KindRejected, RejectUnknownFormat},
		{"not transactional", encodeMessage(false, 0x40D0, MessagePrefix, v3(rotatedKey.Key, testXid)), KindRejected, RejectNotTransactional},
		{"small, authentic", m(0x40E0, signedV3(rotatedKey.Key, testXid, fieldsOf("t", "k", "{}", "{}"))), KindEvent, ""},
		{"small, forged", m(0x40F0, signedV3([]byte{1}, testXid, fieldsOf("t", "k", "{}", "{}"))), KindRejected, RejectBadMAC},
	}
}

// decodeFiltered sends walMsgs through a frame filter that streams
// outboxd messages over limit + ownSlack bytes (read in chunks of
// readSizes) and pgproto3, and decodes what arrives with a decoder that
// reads the filter's checks.
func decodeFiltered(t *testing.T, walMsgs [][]byte, limit int, readSizes []int) []Message {
	t.Helper()
	in := bytes.Clone(copyBoth)
	for _, w := range walMsgs {
		in = append(in, copyData(w)...)
	}
	f := newFrameFilter(&chunked{in: in, sizes: readSizes}, MessagePrefix, nil)
	d := NewDecoder(DecoderConfig{Messages: true, MessageKey: rotatedKey})
	d.streamed = &streamedMessages{}
	f.streamOwn(rotatedKey, limit, d.streamed)
	fe := pgproto3.NewFrontend(f, io.Discard)
	var out []Message
	for {
		m, err := fe.Receive()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break // the input's end; a message cut short shows in the count
		}
		if err != nil {
			t.Fatal(err)
		}
		cd, ok := m.(*pgproto3.CopyData)
		if !ok {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		if len(xld.WALData) > 1<<10 && xld.WALData[0] == 'M' && string(xld.WALData[10:10+len(MessagePrefix)]) == MessagePrefix {
			t.Errorf("an outboxd message of %d bytes reached the decoder whole", len(xld.WALData))
		}
		got, err := d.Decode(xld.WALData)
		if err != nil {
			t.Fatalf("decode %q: %v", xld.WALData[0], err)
		}
		out = append(out, got)
	}
	if len(d.streamed.q) != 0 {
		t.Errorf("%d checks left in the queue", len(d.streamed.q))
	}
	return out
}

// TestFrameFilterStreamedOwnMessagesJudgedAsWhole: an outboxd message
// larger than a record can be, read through its MAC check by the frame
// filter in chunks of any size, is rejected exactly as the whole-content
// verifier rejects it (same reason and detail: forged, tampered past what
// is held, replayed, v1/v2 rules, malformed, keys rotated); an authentic
// one becomes a bad event naming its size and --kafka-max-message-bytes,
// keeping its topic and key but no payload. Smaller ones decode as before.
func TestFrameFilterStreamedOwnMessagesJudgedAsWhole(t *testing.T) {
	const limit = 1000
	cases := bigOwnCases()
	wal := [][]byte{begin(testXid)}
	for _, c := range cases {
		wal = append(wal, c.msg)
	}
	wal = append(wal, outboxRelation(), outboxInsert(1, "a"), commit())

	whole := decodeAll(t, NewDecoder(DecoderConfig{Messages: true, MessageKey: rotatedKey}), wal...)
	for i, c := range cases {
		w := whole[1+i]
		if w.Kind != c.kind || w.Rejected.Reason != c.reason {
			t.Fatalf("%s: the whole-content decoder gives %v %+v, the case says %v %q", c.name, w.Kind, w.Rejected, c.kind, c.reason)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, sizes := range [][]int{nil, {1}, {7, 64, 3}, {1 << 16}, genSizes(r), genSizes(r)} {
		got := decodeFiltered(t, wal, limit, sizes)
		if len(got) != len(whole) {
			t.Fatalf("reads %v: %d messages, want %d", sizes, len(got), len(whole))
		}
		for i, w := range whole {
			g := got[i]
			var c *ownCase
			if i >= 1 && i <= len(cases) {
				c = &cases[i-1]
			}
			streamed := c != nil && len(c.msg) > limit+ownSlack && c.name != "not transactional"
			if !streamed || w.Kind == KindRejected {
				if !reflect.DeepEqual(g, w) {
					t.Fatalf("reads %v, message %d: %+v\nwhole: %+v", sizes, i, g, w)
				}
				continue
			}
			var lm logicalMessage
			_ = lm.decode(c.msg)
			id := strconv.FormatUint(uint64(lm.lsn), 10)
			reason := fmt.Sprintf("outbox_emit message id=%s: its content of %d bytes is larger than --kafka-max-message-bytes (%d)", id, len(lm.content), limit)
			if g.Kind != KindBad || g.Bad.ID != id || g.Bad.Reason != reason {
				t.Fatalf("%s: %v %+v, want the bad event %q", c.name, g.Kind, g.Bad, reason)
			}
			want := []ColumnText{{Name: "topic", Value: []byte("orders")}, {Name: "key", Value: []byte("order-7")}}
			if c.name == "authentic, fields do not parse" {
				want = nil
			}
			if !reflect.DeepEqual(g.Bad.Columns, want) {
				t.Fatalf("%s: columns %+v, want %+v", c.name, g.Bad.Columns, want)
			}
		}
	}
}

// TestFrameFilterStreamedOwnKeepsMinXid: an authentic streamed message
// raises the oldest xid the session accepts as a whole one does, so a
// message of an earlier xid epoch after it is still rejected as replayed.
func TestFrameFilterStreamedOwnKeepsMinXid(t *testing.T) {
	const limit = 10
	pad := strings.Repeat("x", ownSlack+100)
	const xid = 3<<31 + 5 // its low 32 bits, what Begin carries, are those of xid - 2<<31 too
	wal := [][]byte{
		begin(uint32(xid & 0xFFFFFFFF)),
		encodeMessage(true, 0x5000, MessagePrefix, signedV3(rotatedKey.Key, xid, fieldsOf("t", "k", "{}", pad))),
		encodeMessage(true, 0x5010, MessagePrefix, signedV3(rotatedKey.Key, xid-2<<31, fieldsOf("t", "k", "{}", pad))),
		commit(),
	}
	got := decodeFiltered(t, wal, limit, []int{4096})
	if got[1].Kind != KindBad {
		t.Fatalf("authentic: %v %+v", got[1].Kind, got[1].Rejected)
	}
	if got[2].Kind != KindRejected || got[2].Rejected.Reason != RejectReplayed {
		t.Fatalf("an earlier epoch after it: %v %+v, want replayed", got[2].Kind, got[2].Rejected)
	}
}
