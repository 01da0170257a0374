package replication

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// ---- tests ----

func TestDecodeFullTransaction(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	got := decodeAll(t, d,
		begin(731),
		outboxRelation(),
		outboxInsert(1, "order-1"),
		outboxInsert(2, "order-2"),
		commit(),
	)
	want := []Message{
		{Kind: KindBegin, Begin: Begin{Xid: 731, FinalLSN: 0x153B4F8, CommitTime: commitTime}},
		{Kind: KindNone},
		{Kind: KindEvent, Event: outboxEvent(1, "order-1")},
		{Kind: KindEvent, Event: outboxEvent(2, "order-2")},
		{Kind: KindCommit, Commit: Commit{CommitLSN: 0x153B4F8, EndLSN: 0x153B528, CommitTime: commitTime}},
	}
	for i := range want {
		if s := diffMessage(got[i], want[i]); s != "" {
			t.Errorf("message %d: %s", i, s)
		}
	}
	if got[0].Begin.CommitTime.Location() != time.UTC {
		t.Errorf("CommitTime location = %v, want UTC", got[0].Begin.CommitTime.Location())
	}
	// A second transaction on the same decoder.
	decodeAll(t, d, begin(732), outboxInsert(3, "order-3"), commit())
}

// TestDecodeEvents checks the Event built from one Insert for various
// outbox table layouts and values.
func TestDecodeEvents(t *testing.T) {
	type tc struct {
		name   string
		cfg    DecoderConfig
		rel    []byte
		insert []byte
		want   Event
	}
	tests := []tc{
		{
			name:   "standard table",
			rel:    outboxRelation(),
			insert: outboxInsert(7, "order-7"),
			want:   outboxEvent(7, "order-7"),
		},
		{
			name: "reordered and extra columns",
			rel: encodeRelation(outboxRel, "public", "outbox",
				column{"trace_id", oidUUID}, column{"payload", oidJSONB}, column{"tenant", oidText},
				column{"event_type", oidText}, column{"id", oidInt8}, column{"created_at", oidTimestamptz},
				column{"topic", oidText}, column{"aggregate_id", oidText}, column{"published", 16}),
			insert: encodeInsert(outboxRel,
				txt("6f1c2d9e-0000-4000-8000-000000000001"), txt(`{"order": 42, "items": [1, 2]}`), null,
				txt("OrderCreated"), txt("7"), txt("2026-11-29 09:21:40.000005+00"),
				txt("orders"), txt("order-7"), txt("f")),
			want: outboxEvent(7, "order-7"),
		},
		{
			name:   "only required columns",
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt4}, column{"aggregate_id", oidVarchar}, column{"payload", oidText}),
			insert: encodeInsert(outboxRel, txt("-2147483648"), txt("a"), txt("plain text")),
			want:   Event{ID: -2147483648, AggregateID: "a", Payload: []byte("plain text")},
		},
		{
			name:   "int2 id",
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt2}, column{"aggregate_id", oidText}, column{"payload", oidJSON}),
			insert: encodeInsert(outboxRel, txt("32767"), txt("a"), txt(`{"json": "not normalized" }`)),
			want:   Event{ID: 32767, AggregateID: "a", Payload: []byte(`{"json": "not normalized" }`)},
		},
		{
			name:   "max int8 id",
			rel:    outboxRelation(),
			insert: encodeInsert(outboxRel, txt("9223372036854775807"), txt("a"), txt("o"), txt("{}"), null, null),
			want:   Event{ID: 9223372036854775807, AggregateID: "a", Topic: "o", Payload: []byte("{}")},
		},
		{
			name:   "NULL topic, event_type and created_at",
			rel:    outboxRelation(),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), null, txt("{}"), null, null),
			want:   Event{ID: 1, AggregateID: "a", Payload: []byte("{}")},
		},
		{
			name:   "empty aggregate_id and payload",
			rel:    outboxRelation(),
			insert: encodeInsert(outboxRel, txt("1"), txt(""), null, txt(""), null, null),
			want:   Event{ID: 1, AggregateID: "", Payload: []byte{}},
		},
		{
			name: "bytea payload is decoded from hex",
			rel: encodeRelation(outboxRel, "public", "outbox",
				column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea}),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), txt(`\x000102fffe0A7b7D`)),
			want:   Event{ID: 1, AggregateID: "a", Payload: []byte{0, 1, 2, 0xff, 0xfe, 0x0a, '{', '}'}},
		},
		{
			name: "empty bytea payload",
			rel: encodeRelation(outboxRel, "public", "outbox",
				column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidBytea}),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), txt(`\x`)),
			want:   Event{ID: 1, AggregateID: "a", Payload: []byte{}},
		},
		{
			name: "jsonb payload bytes are exact",
			rel:  outboxRelation(),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), txt("t"),
				txt("{\"s\": \"caf\xc3\xa9 \\\"q\\\" \\\\ \\u0000\", \"n\": 1.50, \"big\": 12345678901234567890}"), null, null),
			want: Event{ID: 1, AggregateID: "a", Topic: "t",
				Payload: []byte("{\"s\": \"caf\xc3\xa9 \\\"q\\\" \\\\ \\u0000\", \"n\": 1.50, \"big\": 12345678901234567890}")},
		},
		{
			name: "custom schema, table and column names",
			cfg: DecoderConfig{Schema: "app", Table: "events", Columns: Columns{
				ID: "event_id", AggregateID: "key", Payload: "body", Topic: "stream", CreatedAt: "ts", EventType: "kind"}},
			rel: encodeRelation(outboxRel, "app", "events",
				column{"event_id", oidInt8}, column{"key", oidText}, column{"body", oidJSONB},
				column{"stream", oidText}, column{"ts", oidTimestamptz}, column{"kind", oidText},
				column{"id", oidText}, column{"payload", oidText}),
			insert: encodeInsert(outboxRel, txt("5"), txt("k"), txt("{}"), txt("s"),
				txt("2026-11-29 09:21:40.000005+00"), txt("K"), txt("not the id"), txt("not the payload")),
			want: Event{ID: 5, AggregateID: "k", Payload: []byte("{}"), Topic: "s", EventType: "K", CreatedAt: createdAt},
		},
		{
			name: "partially customized columns keep the other defaults",
			cfg:  DecoderConfig{Columns: Columns{AggregateID: "key"}},
			rel: encodeRelation(outboxRel, "public", "outbox",
				column{"id", oidInt8}, column{"key", oidText}, column{"payload", oidJSONB}, column{"topic", oidText}),
			insert: encodeInsert(outboxRel, txt("5"), txt("k"), txt("{}"), txt("s")),
			want:   Event{ID: 5, AggregateID: "k", Payload: []byte("{}"), Topic: "s"},
		},
		{
			name: "duplicate column name: the first one counts",
			rel: encodeRelation(outboxRel, "public", "outbox",
				column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"id", oidInt8}),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), txt("p"), txt("not a number")),
			want:   Event{ID: 1, AggregateID: "a", Payload: []byte("p")},
		},
		{
			name:   "extra column may be NULL",
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"x", oidText}),
			insert: encodeInsert(outboxRel, txt("1"), txt("a"), txt("p"), null),
			want:   Event{ID: 1, AggregateID: "a", Payload: []byte("p")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.cfg)
			got := decodeAll(t, d, begin(1), tt.rel, tt.insert)
			if got[2].Kind != KindEvent {
				t.Fatalf("Kind = %v, want event", got[2].Kind)
			}
			if s := diffEvent(got[2].Event, tt.want); s != "" {
				t.Error(s)
			}
			if got[2].Event.Payload == nil {
				t.Error("Payload is nil, want non-nil")
			}
		})
	}
}

func TestDecodeRelationResentWithNewColumnOrder(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	got := decodeAll(t, d, outboxInsert(1, "a"))[0]
	if s := diffEvent(got.Event, outboxEvent(1, "a")); s != "" {
		t.Fatal(s)
	}
	// ALTER TABLE ... ADD COLUMN, then a dump/restore that reordered the
	// columns: the server sends a new Relation with the same id mid-stream.
	decodeAll(t, d, encodeRelation(outboxRel, "public", "outbox",
		column{"payload", oidBytea}, column{"aggregate_id", oidText}, column{"trace", oidText}, column{"id", oidInt8}))
	got = decodeAll(t, d, encodeInsert(outboxRel, txt(`\x7b7d`), txt("b"), txt("t-1"), txt("2")))[0]
	if s := diffEvent(got.Event, Event{ID: 2, AggregateID: "b", Payload: []byte("{}")}); s != "" {
		t.Fatal(s)
	}
	// The old layout no longer applies: an insert with its column count is
	// rejected rather than mis-mapped.
	if _, err := d.Decode(outboxInsert(3, "c")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("insert in the old layout: err = %v, want ErrProtocol", err)
	}
	// Re-sent again, now without a required column: inserts fail ...
	decodeAll(t, d, encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"payload", oidText}))
	if _, err := d.Decode(encodeInsert(outboxRel, txt("4"), txt("p"))); !errors.Is(err, ErrMissingColumn) {
		t.Fatalf("err = %v, want ErrMissingColumn", err)
	}
	// ... until it is fixed.
	decodeAll(t, d, outboxRelation(), outboxInsert(5, "e"), commit())
}

func TestDecodeRelationRenamedAwayFromOutbox(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	decodeAll(t, d, encodeRelation(outboxRel, "public", "outbox_old", outboxColumns...))
	got := decodeAll(t, d, outboxInsert(1, "a"))[0]
	if got.Kind != KindNone {
		t.Fatalf("Kind = %v, want none", got.Kind)
	}
}

func TestDecodeCreatedAt(t *testing.T) {
	tests := []struct {
		name string
		oid  uint32
		text string
		want time.Time // zero: ErrBadValue expected
	}{
		{"timestamptz UTC with micros", oidTimestamptz, "2026-11-29 09:21:44.123456+00", time.Date(2026, 11, 29, 9, 21, 44, 123456000, time.UTC)},
		{"timestamptz no fraction", oidTimestamptz, "2026-11-29 09:21:44+00", time.Date(2026, 11, 29, 9, 21, 44, 0, time.UTC)},
		{"timestamptz short fraction", oidTimestamptz, "2026-11-29 09:21:44.5+00", time.Date(2026, 11, 29, 9, 21, 44, 500000000, time.UTC)},
		{"timestamptz +05:30", oidTimestamptz, "2026-11-29 14:51:44.123456+05:30", time.Date(2026, 11, 29, 9, 21, 44, 123456000, time.UTC)},
		{"timestamptz -03", oidTimestamptz, "2026-11-29 06:21:44-03", time.Date(2026, 11, 29, 9, 21, 44, 0, time.UTC)},
		{"timestamptz -09:30 across midnight", oidTimestamptz, "2026-12-31 23:30:00-09:30", time.Date(2027, 1, 1, 9, 0, 0, 0, time.UTC)},
		{"timestamptz LMT offset with seconds", oidTimestamptz, "1890-01-01 00:00:00+00:53:28", time.Date(1889, 12, 31, 23, 6, 32, 0, time.UTC)},
		{"timestamptz leap day", oidTimestamptz, "2024-02-29 00:00:00+00", time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"timestamptz year 10000", oidTimestamptz, "10000-01-01 00:00:00+00", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"timestamp is UTC", oidTimestamp, "2026-11-29 09:21:44.123456", time.Date(2026, 11, 29, 9, 21, 44, 123456000, time.UTC)},
		{"timestamp no fraction", oidTimestamp, "2026-11-29 09:21:44", time.Date(2026, 11, 29, 9, 21, 44, 0, time.UTC)},
		{"text column in ISO format", oidText, "2026-11-29 09:21:44+00", time.Date(2026, 11, 29, 9, 21, 44, 0, time.UTC)},
		{"BC", oidTimestamptz, "0044-03-15 12:00:00+00 BC", time.Time{}},
		{"infinity", oidTimestamptz, "infinity", time.Time{}},
		{"-infinity", oidTimestamp, "-infinity", time.Time{}},
		{"not a leap year", oidTimestamptz, "2026-02-29 00:00:00+00", time.Time{}},
		{"month 13", oidTimestamptz, "2026-13-01 00:00:00+00", time.Time{}},
		{"hour 24", oidTimestamptz, "2026-11-29 24:00:00+00", time.Time{}},
		{"ISO 8601 T", oidTimestamptz, "2026-11-29T09:21:44+00", time.Time{}},
		{"Z suffix", oidTimestamptz, "2026-11-29 09:21:44Z", time.Time{}},
		{"trailing garbage", oidTimestamptz, "2026-11-29 09:21:44+00x", time.Time{}},
		{"empty fraction", oidTimestamptz, "2026-11-29 09:21:44.+00", time.Time{}},
		{"offset too large", oidTimestamptz, "2026-11-29 09:21:44+16", time.Time{}},
		{"Postgres style", oidTimestamptz, "Sun Nov 29 09:21:44 2026 UTC", time.Time{}},
		{"date only", oidTimestamptz, "2026-11-29", time.Time{}},
		{"empty", oidTimestamptz, "", time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(DecoderConfig{})
			decodeAll(t, d, begin(1), encodeRelation(outboxRel, "public", "outbox",
				column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"created_at", tt.oid}))
			m, err := d.Decode(encodeInsert(outboxRel, txt("1"), txt("a"), txt("p"), txt(tt.text)))
			if tt.want.IsZero() {
				if !errors.Is(err, ErrBadValue) {
					t.Fatalf("err = %v, want ErrBadValue", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Event.CreatedAt; !got.Equal(tt.want) || got.Location() != time.UTC {
				t.Fatalf("CreatedAt = %v, want %v in UTC", got, tt.want)
			}
		})
	}
}

func TestDecodeIgnoresOtherTables(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	msgs := [][]byte{
		begin(1),
		encodeRelation(otherRel, "public", "orders", column{"id", oidInt4}, column{"note", oidText}),
		encodeInsert(otherRel, txt("1"), null),
		// An outbox table in another schema, and a binary and unchanged
		// value that would be rejected in the outbox.
		encodeRelation(otherRel+1, "other", "outbox", outboxColumns...),
		encodeInsert(otherRel+1, null, toast, value{'b', "x"}, null, null, null),
		commit(),
	}
	for i, m := range decodeAll(t, d, msgs...) {
		if want := []Kind{KindBegin, KindNone, KindNone, KindNone, KindNone, KindCommit}[i]; m.Kind != want {
			t.Errorf("message %d: Kind = %v, want %v", i, m.Kind, want)
		}
	}
	// Malformed rows of other tables are still malformed.
	decodeAll(t, d, begin(2))
	if _, err := d.Decode(append(encodeInsert(otherRel, txt("1"), null), 0)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v, want ErrProtocol", err)
	}
}

func TestDecodeIgnoresMessagesTheOutboxDoesNotNeed(t *testing.T) {
	tests := []struct {
		name string
		msg  []byte
	}{
		{"update", encodeUpdate(outboxRel, txt("1"), txt("a"), null, txt("{}"), null, null)},
		{"delete", encodeDelete(outboxRel, txt("1"))},
		{"truncate", encodeTruncate(outboxRel, otherRel)},
		{"type", encodeType(16402, "public", "mood")},
		{"origin", encodeOrigin(0x12345678, "upstream")},
		{"transactional message", encodeMessage(true, 0x153C478, "outboxd", []byte("hello"))},
		{"non-transactional message", encodeMessage(false, 0x153C4E8, "outboxd", []byte("nontx"))},
		// They are not parsed beyond the type byte.
		{"bare update", []byte{'U'}},
		{"bare delete", []byte{'D'}},
		{"bare truncate", []byte{'T'}},
		{"bare type", []byte{'Y'}},
		{"bare origin", []byte{'O'}},
		{"bare message", []byte{'M'}},
		{"message with a 2 GB content length", append(encodeMessage(true, 1, "p", nil)[:12], 0x7f, 0xff, 0xff, 0xff)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Inside and outside a transaction, before and after the outbox
			// relation is known.
			for _, setup := range [][][]byte{nil, {begin(1)}, {begin(1), outboxRelation()}} {
				d := NewDecoder(DecoderConfig{})
				decodeAll(t, d, setup...)
				m, err := d.Decode(tt.msg)
				if err != nil || m.Kind != KindNone {
					t.Fatalf("after %d messages: Decode = %v, %v; want none, nil", len(setup), m.Kind, err)
				}
			}
		})
	}
}

func TestDecodeDoesNotAliasInput(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	buf := outboxInsert(1, "order-1")
	m := decodeAll(t, d, buf)[0]
	for i := range buf {
		buf[i] = 'X'
	}
	if s := diffEvent(m.Event, outboxEvent(1, "order-1")); s != "" {
		t.Fatalf("after overwriting the input: %s", s)
	}
	// Appending to the payload must not write into anything else.
	p := m.Event.Payload
	_ = append(p, "tail"...)
	if s := diffEvent(m.Event, outboxEvent(1, "order-1")); s != "" {
		t.Fatal(s)
	}
}

func TestDecodeInsertAllocations(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	msg := outboxInsert(123456, "order-42")
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := d.Decode(msg); err != nil {
			t.Fatal(err)
		}
	})
	// The payload copy and the aggregate id; topic and event type are
	// interned.
	if allocs > 2 {
		t.Errorf("Decode(insert) allocates %v times, want <= 2", allocs)
	}
}

// TestDecodeInternBounded checks that many distinct topics do not grow the
// intern table without bound.
func TestDecodeInternBounded(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	for i := range 10 * maxInterned {
		m := decodeAll(t, d, encodeInsert(outboxRel, txt("1"), txt("a"), txt(fmt.Sprint("topic-", i)), txt("{}"), null, null))[0]
		if want := fmt.Sprint("topic-", i); m.Event.Topic != want {
			t.Fatalf("Topic = %q, want %q", m.Event.Topic, want)
		}
	}
	if len(d.interned) > maxInterned {
		t.Fatalf("%d interned strings, want <= %d", len(d.interned), maxInterned)
	}
}
