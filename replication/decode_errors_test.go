package replication

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestDecodeErrors checks the error returned by the last message of each
// sequence.
func TestDecodeErrors(t *testing.T) {
	binaryValue := value{'b', "\x00\x00\x00\x01"}
	tests := []struct {
		name    string
		cfg     DecoderConfig
		msgs    [][]byte
		wantErr error
		wantMsg string // exact Error() text, when set
	}{
		{
			name:    "missing required column names column and table",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"payload", oidJSONB}), encodeInsert(outboxRel, txt("1"), txt("{}"))},
			wantErr: ErrMissingColumn,
			wantMsg: `replication: outbox table public.outbox has no column "aggregate_id"`,
		},
		{
			name:    "missing id column",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", column{"aggregate_id", oidText}, column{"payload", oidJSONB}), encodeInsert(outboxRel, txt("a"), txt("{}"))},
			wantErr: ErrMissingColumn,
			wantMsg: `replication: outbox table public.outbox has no column "id"`,
		},
		{
			name: "missing custom payload column",
			cfg:  DecoderConfig{Schema: "app", Table: "events", Columns: Columns{Payload: "body"}},
			msgs: [][]byte{begin(1), encodeRelation(outboxRel, "app", "events", outboxColumns...),
				encodeInsert(outboxRel, txt("1"), txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrMissingColumn,
			wantMsg: `replication: outbox table app.events has no column "body"`,
		},
		{
			name:    "NULL id",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, null, txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
			wantMsg: `replication: bad value in Insert message at offset 8: outbox row: column "id" is NULL`,
		},
		{
			name:    "NULL aggregate_id names the row id",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("42"), null, null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
			wantMsg: `replication: bad value in Insert message at offset 15: outbox row id=42: column "aggregate_id" is NULL`,
		},
		{
			name:    "NULL payload",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("42"), txt("a"), null, null, null, null)},
			wantErr: ErrBadValue,
			wantMsg: `replication: bad value in Insert message at offset 22: outbox row id=42: column "payload" is NULL`,
		},
		{
			name:    "id not an integer",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("6f1c2d9e"), txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
			wantMsg: `replication: bad value in Insert message at offset 13: outbox row: column "id" is not an integer: "6f1c2d9e"`,
		},
		{
			name:    "id overflows int64",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("9223372036854775808"), txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
		},
		{
			name:    "id with plus sign",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("+1"), txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
		},
		{
			name:    "created_at unparsable",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("42"), txt("a"), null, txt("{}"), txt("yesterday"), null)},
			wantErr: ErrBadValue,
		},
		{
			name:    "unchanged TOAST value in an insert",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("42"), txt("a"), null, toast, null, null)},
			wantErr: ErrBadValue,
		},
		{
			name:    "unchanged TOAST value in an extra column",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", append(outboxColumns, column{"x", oidText})...), encodeInsert(outboxRel, txt("42"), txt("a"), null, txt("{}"), null, null, toast)},
			wantErr: ErrBadValue,
		},
		{
			name:    "binary value",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, binaryValue, txt("a"), null, txt("{}"), null, null)},
			wantErr: ErrBadValue,
		},
		{
			name:    "bytea in escape format",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea}), encodeInsert(outboxRel, txt("1"), txt("a"), txt(`abc\000`))},
			wantErr: ErrBadValue,
		},
		{
			name:    "bytea with odd hex digits",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea}), encodeInsert(outboxRel, txt("1"), txt("a"), txt(`\x0`))},
			wantErr: ErrBadValue,
		},
		{
			name:    "bytea with a non-hex digit",
			msgs:    [][]byte{begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea}), encodeInsert(outboxRel, txt("1"), txt("a"), txt(`\x0g`))},
			wantErr: ErrBadValue,
		},
		{
			name:    "insert for an unknown relation",
			msgs:    [][]byte{begin(1), outboxInsert(1, "a")},
			wantErr: ErrUnknownRelation,
			wantMsg: `replication: unknown relation in Insert message at offset 1: no Relation message for relation id 16385`,
		},
		{
			name:    "insert outside a transaction",
			msgs:    [][]byte{outboxRelation(), outboxInsert(1, "a")},
			wantErr: ErrProtocol,
			wantMsg: `replication: protocol violation in Insert message at offset 0: insert outside a transaction`,
		},
		{
			name:    "insert after commit",
			msgs:    [][]byte{begin(1), outboxRelation(), commit(), outboxInsert(1, "a")},
			wantErr: ErrProtocol,
		},
		{
			name:    "commit outside a transaction",
			msgs:    [][]byte{commit()},
			wantErr: ErrProtocol,
		},
		{
			name:    "begin inside a transaction",
			msgs:    [][]byte{begin(1), begin(2)},
			wantErr: ErrProtocol,
			wantMsg: `replication: protocol violation in Begin message at offset 0: begin inside a transaction`,
		},
		{
			name:    "insert with old tuple marker",
			msgs:    [][]byte{begin(1), outboxRelation(), append([]byte{'I', 0, 0, 0x40, 0x01, 'K'}, outboxInsert(1, "a")[6:]...)},
			wantErr: ErrProtocol,
		},
		{
			name:    "insert with fewer columns than its relation",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("1"), txt("a"), txt("p"))},
			wantErr: ErrProtocol,
		},
		{
			name:    "unknown tuple value kind",
			msgs:    [][]byte{begin(1), outboxRelation(), encodeInsert(outboxRel, txt("1"), txt("a"), value{kind: 'x'}, txt("{}"), null, null)},
			wantErr: ErrProtocol,
		},
		{
			name:    "value length claims 2 GB",
			msgs:    [][]byte{begin(1), outboxRelation(), append(encodeInsert(outboxRel, txt("1"), txt("a"), null)[:len(encodeInsert(outboxRel, txt("1"), txt("a"), null))-1], 't', 0x7f, 0xff, 0xff, 0xff, 'x')},
			wantErr: ErrProtocol,
		},
		{
			name:    "relation claims 65535 columns",
			msgs:    [][]byte{begin(1), append(encodeRelation(outboxRel, "public", "outbox")[:len(encodeRelation(outboxRel, "public", "outbox"))-2], 0xff, 0xff, 0, 'i', 'd', 0)},
			wantErr: ErrProtocol,
		},
		{
			name:    "relation namespace not terminated",
			msgs:    [][]byte{[]byte("R\x00\x00\x40\x01public")},
			wantErr: ErrProtocol,
		},
		{name: "stream start", msgs: [][]byte{append([]byte{'S'}, 0, 0, 2, 0xdb, 1)}, wantErr: ErrProtocol,
			wantMsg: `replication: protocol violation in StreamStart message at offset 0: streaming of in-progress transactions is not enabled`},
		{name: "stream stop", msgs: [][]byte{{'E'}}, wantErr: ErrProtocol},
		{name: "stream commit", msgs: [][]byte{append([]byte{'c'}, make([]byte, 29)...)}, wantErr: ErrProtocol},
		{name: "stream abort", msgs: [][]byte{append([]byte{'A'}, make([]byte, 8)...)}, wantErr: ErrProtocol},
		{name: "unknown message type", msgs: [][]byte{{'Z', 1, 2}}, wantErr: ErrProtocol,
			wantMsg: `replication: protocol violation in unknown ('Z') message at offset 0: unknown message type 'Z'`},
		{name: "begin prepare (protocol 3)", msgs: [][]byte{append([]byte{'b'}, make([]byte, 28)...)}, wantErr: ErrProtocol},
		{name: "empty message", msgs: [][]byte{{}}, wantErr: ErrProtocol, wantMsg: "replication: protocol violation: empty message"},
		{name: "nil message", msgs: [][]byte{nil}, wantErr: ErrProtocol},
		{name: "begin with a trailing byte", msgs: [][]byte{append(begin(1), 0)}, wantErr: ErrProtocol,
			wantMsg: `replication: protocol violation in Begin message at offset 21: 1 trailing bytes`},
		{name: "commit with a trailing byte", msgs: [][]byte{begin(1), append(commit(), 0)}, wantErr: ErrProtocol},
		{name: "insert with a trailing byte", msgs: [][]byte{begin(1), outboxRelation(), append(outboxInsert(1, "a"), 0)}, wantErr: ErrProtocol},
		{name: "relation with a trailing byte", msgs: [][]byte{append(outboxRelation(), 0)}, wantErr: ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.cfg)
			last := len(tt.msgs) - 1
			decodeAll(t, d, tt.msgs[:last]...)
			m, err := d.Decode(tt.msgs[last])
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			for _, other := range []error{ErrProtocol, ErrUnknownRelation, ErrMissingColumn, ErrBadValue} {
				if other != tt.wantErr && errors.Is(err, other) {
					t.Errorf("err %v also matches %v", err, other)
				}
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("err.Error() =\n\t%s\nwant\n\t%s", err, tt.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "replication: ") {
				t.Errorf("err %q lacks the package prefix", err)
			}
			if m.Kind != KindNone {
				t.Errorf("Kind = %v with an error, want none", m.Kind)
			}
		})
	}
}

func TestDecodeErrorTypes(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"payload", oidText}))
	_, err := d.Decode(encodeInsert(outboxRel, txt("1"), txt("p")))
	var mce *MissingColumnError
	if !errors.As(err, &mce) || *mce != (MissingColumnError{Schema: "public", Table: "outbox", Column: "aggregate_id"}) {
		t.Fatalf("err = %#v, want *MissingColumnError for aggregate_id", err)
	}
	_, err = d.Decode(encodeInsert(999, txt("1")))
	var de *DecodeError
	if !errors.As(err, &de) || de.MsgType != 'I' || de.Offset != 1 || de.Err != ErrUnknownRelation {
		t.Fatalf("err = %#v, want *DecodeError{MsgType: 'I', Offset: 1, Err: ErrUnknownRelation}", err)
	}
}

// TestDecodeErrorKeepsState checks that a failed message changes neither the
// transaction state nor the relation cache.
func TestDecodeErrorKeepsState(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	rel := outboxRelation()
	if _, err := d.Decode(rel[:len(rel)-1]); err == nil {
		t.Fatal("truncated relation decoded")
	}
	if _, err := d.Decode(begin(2)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("begin in txn: err = %v", err)
	}
	m := decodeAll(t, d, outboxInsert(1, "a"), commit())
	if m[0].Kind != KindEvent || m[1].Kind != KindCommit {
		t.Fatalf("kinds = %v, %v", m[0].Kind, m[1].Kind)
	}
	if _, err := d.Decode(commit()); !errors.Is(err, ErrProtocol) {
		t.Fatalf("second commit: err = %v", err)
	}
	decodeAll(t, d, begin(3), outboxInsert(2, "b"), commit())
}

// TestDecodeEveryTruncationFails cuts valid messages at every length and
// checks that each cut is an error, not a panic, and that the decoder still
// works afterwards.
func TestDecodeEveryTruncationFails(t *testing.T) {
	byteaRel := encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea})
	tests := []struct {
		name  string
		setup [][]byte
		msg   []byte
	}{
		{"begin", nil, begin(1)},
		{"commit", [][]byte{begin(1)}, commit()},
		{"relation", [][]byte{begin(1)}, outboxRelation()},
		{"other relation", [][]byte{begin(1)}, encodeRelation(otherRel, "public", "orders", column{"id", oidInt4}, column{"note", oidText})},
		{"insert", [][]byte{begin(1), outboxRelation()}, outboxInsert(1, "order-1")},
		{"insert with NULLs", [][]byte{begin(1), outboxRelation()}, encodeInsert(outboxRel, txt("1"), txt("a"), null, txt("{}"), null, null)},
		{"insert with empty values", [][]byte{begin(1), outboxRelation()}, encodeInsert(outboxRel, txt("1"), txt(""), txt(""), txt(""), null, txt(""))},
		{"bytea insert", [][]byte{begin(1), byteaRel}, encodeInsert(outboxRel, txt("1"), txt("a"), txt(`\x00ff`))},
		{"other table insert", [][]byte{begin(1), encodeRelation(otherRel, "public", "orders", column{"id", oidInt4}, column{"note", oidText})}, encodeInsert(otherRel, txt("1"), txt("first"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for n := 0; n < len(tt.msg); n++ {
				d := NewDecoder(DecoderConfig{})
				decodeAll(t, d, tt.setup...)
				cut := bytes.Clone(tt.msg[:n])
				m, err := d.Decode(cut)
				if err == nil {
					t.Fatalf("cut at %d of %d: no error (Kind %v)", n, len(tt.msg), m.Kind)
				}
				if !errors.Is(err, ErrProtocol) {
					t.Errorf("cut at %d: err = %v, want ErrProtocol", n, err)
				}
				if m.Kind != KindNone {
					t.Errorf("cut at %d: Kind = %v", n, m.Kind)
				}
				if _, err := d.Decode(tt.msg); err != nil {
					t.Fatalf("whole message after the cut at %d: %v", n, err)
				}
			}
		})
	}
}
