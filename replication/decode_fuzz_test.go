package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pglogrepl"
)

// splitMessages cuts a fuzz input into messages: each is a big-endian uint16
// length followed by that many bytes (fewer if the input ends first).
func splitMessages(data []byte) [][]byte {
	var msgs [][]byte
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		n = min(n, len(data))
		msgs = append(msgs, data[:n])
		data = data[n:]
	}
	return msgs
}

// joinMessages is the inverse of splitMessages.
func joinMessages(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

// FuzzDecode feeds a sequence of messages to one Decoder. Decode must never
// panic, and what it accepts must agree with pglogrepl.Parse and refEvent.
func FuzzDecode(f *testing.F) {
	// The corpus lives in testdata/fuzz/FuzzDecode (see TestWriteFuzzSeeds);
	// one seed here keeps the target meaningful without it.
	f.Add(joinMessages(begin(1), outboxRelation(), outboxInsert(1, "a"), commit()))
	cols := DefaultColumns()
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder(DecoderConfig{})
		rels := map[uint32]*pglogrepl.RelationMessage{}
		for i, msg := range splitMessages(data) {
			in := bytes.Clone(msg)
			m, err := d.Decode(in)
			if err != nil {
				if m.Kind != KindNone {
					t.Fatalf("message %d: Kind %v with error %v", i, m.Kind, err)
				}
				if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrUnknownRelation) && !errors.Is(err, ErrMissingColumn) && !errors.Is(err, ErrBadValue) {
					t.Fatalf("message %d: error %v wraps no sentinel", i, err)
				}
			}
			// The result must not alias the input.
			ev := m.Event
			payload := bytes.Clone(ev.Payload)
			for j := range in {
				in[j] ^= 0xff
			}
			if !bytes.Equal(ev.Payload, payload) {
				t.Fatalf("message %d: Payload aliases the input", i)
			}
			if len(msg) == 0 {
				continue
			}

			switch msg[0] {
			case 'B':
				if err != nil {
					continue
				}
				p := mustParse(t, msg).(*pglogrepl.BeginMessage)
				if p.Xid != m.Begin.Xid || p.FinalLSN != m.Begin.FinalLSN || !sameTime(p.CommitTime.UnixMicro(), m.Begin.CommitTime.UnixMicro(), msg[9:]) {
					t.Fatalf("begin: pglogrepl %+v, ours %+v", p, m.Begin)
				}
			case 'C':
				if err != nil {
					continue
				}
				p := mustParse(t, msg).(*pglogrepl.CommitMessage)
				if p.CommitLSN != m.Commit.CommitLSN || p.TransactionEndLSN != m.Commit.EndLSN || !sameTime(p.CommitTime.UnixMicro(), m.Commit.CommitTime.UnixMicro(), msg[18:]) {
					t.Fatalf("commit: pglogrepl %+v, ours %+v", p, m.Commit)
				}
			case 'R':
				if err != nil {
					continue
				}
				p := mustParse(t, msg).(*pglogrepl.RelationMessage)
				rels[p.RelationID] = p
			case 'I':
				checkInsert(t, cols, rels, msg, m, err)
			}
		}
	})
}

// checkInsert checks Decode's verdict on an Insert against pglogrepl.Parse
// and refEvent.
func checkInsert(t *testing.T, cols Columns, rels map[uint32]*pglogrepl.RelationMessage, msg []byte, m Message, err error) {
	t.Helper()
	switch {
	case err == nil, errors.Is(err, ErrBadValue), errors.Is(err, ErrMissingColumn):
		// The message is well-formed: pglogrepl must parse it.
	default:
		return
	}
	p := mustParse(t, msg).(*pglogrepl.InsertMessage)
	rel := rels[p.RelationID]
	if rel == nil {
		t.Fatalf("insert for relation %d accepted, but no Relation was", p.RelationID)
	}
	if len(p.Tuple.Columns) != len(rel.Columns) {
		t.Fatalf("insert with %d columns accepted for a relation with %d", len(p.Tuple.Columns), len(rel.Columns))
	}
	isOutbox := rel.Namespace == "public" && rel.RelationName == "outbox"
	if err == nil && m.Kind == KindNone {
		if isOutbox {
			t.Fatalf("insert into the outbox decoded as KindNone")
		}
		return
	}
	if !isOutbox {
		t.Fatalf("insert into %s.%s: Kind %v, err %v; want KindNone", rel.Namespace, rel.RelationName, m.Kind, err)
	}
	want, ok, missing := refEvent(cols, rel, p)
	var mce *MissingColumnError
	switch {
	case errors.As(err, &mce):
		if mce.Column != missing {
			t.Fatalf("missing column %q, reference says %q", mce.Column, missing)
		}
	case err != nil:
		if ok {
			t.Fatalf("Decode: %v; reference accepts the row as %+v", err, want)
		}
	case m.Kind != KindEvent:
		t.Fatalf("Kind = %v, want event", m.Kind)
	case !ok:
		t.Fatalf("Decode accepts %+v; reference rejects the row (missing %q)", m.Event, missing)
	default:
		if s := diffEvent(m.Event, want); s != "" {
			t.Fatal(s)
		}
	}
}

// mustParse runs pglogrepl.Parse on a message Decode accepted: it must not
// fail or panic.
func mustParse(t *testing.T, msg []byte) (m pglogrepl.Message) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("pglogrepl.Parse panics on a message Decode accepted: %v\n%q", r, msg)
		}
	}()
	m, err := pglogrepl.Parse(msg)
	if err != nil {
		t.Fatalf("pglogrepl.Parse fails on a message Decode accepted: %v\n%q", err, msg)
	}
	return m
}

// sameTime compares commit times in microseconds, where pglogrepl's
// nanosecond conversion does not overflow.
func sameTime(theirs, ours int64, raw []byte) bool {
	us := int64(binary.BigEndian.Uint64(raw))
	if us > 1<<62/1000 || us < -(1<<62/1000) {
		return true
	}
	return theirs == ours
}

var updateFuzzSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite testdata/fuzz/FuzzDecode seed files")

// TestWriteFuzzSeeds writes the seed corpus of FuzzDecode:
//
//	go test ./replication -run TestWriteFuzzSeeds -update-fuzz-seeds
//
// Crashers the fuzzer finds are added to the same directory under their own
// names; this test leaves those alone.
func TestWriteFuzzSeeds(t *testing.T) {
	if !*updateFuzzSeeds {
		t.Skip("run with -update-fuzz-seeds to rewrite the corpus")
	}
	seeds := map[string][]byte{}
	for _, file := range []string{"pg15_utc", "pg15_kolkata", "pg15_sao_paulo"} {
		var all [][]byte
		for _, c := range readCaptured(t, "testdata/"+file+".txt") {
			all = append(all, c.msg)
		}
		seeds["seed-"+file+"-stream"] = joinMessages(all...)
	}
	byteaRel := encodeRelation(outboxRel, "public", "outbox", column{"payload", oidBytea}, column{"aggregate_id", oidVarchar}, column{"id", oidInt4}, column{"created_at", oidTimestamp})
	reordered := encodeRelation(outboxRel, "public", "outbox",
		column{"trace_id", oidUUID}, column{"payload", oidJSONB}, column{"event_type", oidText}, column{"id", oidInt8},
		column{"created_at", oidTimestamptz}, column{"topic", oidText}, column{"aggregate_id", oidText})
	other := encodeRelation(otherRel, "public", "orders", column{"id", oidInt4}, column{"note", oidText})
	seeds["seed-full-txn"] = joinMessages(begin(731), outboxRelation(), outboxInsert(1, "order-1"), outboxInsert(2, "order-2"), commit())
	seeds["seed-bytea"] = joinMessages(begin(1), byteaRel, encodeInsert(outboxRel, txt(`\x000102fffe0a`), txt("agg"), txt("7"), txt("2026-11-29 09:21:44")), commit())
	seeds["seed-relation-resent"] = joinMessages(begin(1), outboxRelation(), outboxInsert(1, "a"), reordered,
		encodeInsert(outboxRel, txt("6f1c2d9e-0000-4000-8000-000000000001"), txt("{}"), null, txt("2"), txt("2026-11-29 14:51:44.5+05:30"), txt("t"), txt("b")), commit())
	seeds["seed-other-table"] = joinMessages(begin(1), other, encodeInsert(otherRel, txt("1"), txt("first")),
		encodeUpdate(otherRel, txt("1"), txt("second")), encodeDelete(otherRel, txt("1")), encodeTruncate(otherRel), commit())
	seeds["seed-ignored"] = joinMessages(encodeMessage(false, 1, "outboxd", []byte("hello")), begin(1), encodeOrigin(0x12345678, "upstream"),
		encodeType(16402, "public", "mood"), encodeMessage(true, 2, "outboxd", []byte("x")), commit())
	seeds["seed-missing-column"] = joinMessages(begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"payload", oidJSONB}),
		encodeInsert(outboxRel, txt("1"), txt("{}")), outboxRelation(), outboxInsert(2, "b"), commit())
	seeds["seed-bad-values"] = joinMessages(begin(1), outboxRelation(),
		encodeInsert(outboxRel, null, txt("a"), null, txt("{}"), null, null),
		encodeInsert(outboxRel, txt("42"), txt("a"), null, null, null, null),
		encodeInsert(outboxRel, txt("x"), txt("a"), null, txt("{}"), null, null),
		encodeInsert(outboxRel, txt("1"), txt("a"), null, txt("{}"), txt("2026-11-29 09:21:44-03"), null),
		encodeInsert(outboxRel, txt("1"), txt("a"), null, txt("{}"), txt("infinity"), null),
		encodeInsert(outboxRel, txt("1"), toast, null, txt("{}"), null, null),
		encodeInsert(outboxRel, txt("1"), value{'b', "\x01"}, null, txt("{}"), null, null),
		commit())
	seeds["seed-state-errors"] = joinMessages(outboxInsert(1, "a"), commit(), begin(1), begin(2), encodeInsert(99, txt("1")),
		[]byte{'S', 0, 0, 0, 1, 1}, []byte{'Z'}, nil, commit())

	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range seeds {
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSplitMessages(t *testing.T) {
	msgs := [][]byte{begin(1), {}, outboxRelation(), {'E'}}
	got := splitMessages(joinMessages(msgs...))
	if len(got) != len(msgs) {
		t.Fatalf("%d messages, want %d", len(got), len(msgs))
	}
	for i := range msgs {
		if !bytes.Equal(got[i], msgs[i]) {
			t.Errorf("message %d = %q, want %q", i, got[i], msgs[i])
		}
	}
	if got := splitMessages([]byte{0, 5, 'B', 1}); len(got) != 1 || !bytes.Equal(got[0], []byte{'B', 1}) {
		t.Errorf("short tail: %q", got)
	}
}
