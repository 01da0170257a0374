package replication

import (
	"errors"
	"testing"
)

// TestBadRowCarriesItsColumns: a row that cannot become an event fails with
// ErrBadValue, and the stream's asBadEvent turns that error into a KindBad
// message with the row's raw columns; a protocol error stays an error.
func TestBadRowCarriesItsColumns(t *testing.T) {
	d := NewDecoder(DecoderConfig{})
	decodeAll(t, d, begin(1), outboxRelation())
	_, err := d.Decode(encodeInsert(outboxRel, txt("7"), txt("k"), txt("orders"), null, txt("2026-11-29 09:21:40+00"), null))
	if !errors.Is(err, ErrBadValue) {
		t.Fatalf("err = %v, want ErrBadValue", err)
	}
	m, err := asBadEvent(err)
	if err != nil || m.Kind != KindBad {
		t.Fatalf("asBadEvent: %v %v", m.Kind, err)
	}
	b := m.Bad
	if b.Table != "public.outbox" || b.ID != "7" || len(b.Columns) != len(outboxColumns) ||
		string(b.Columns[1].Value) != "k" || !b.Columns[3].Null || b.Columns[3].Name != "payload" || b.Reason == "" {
		t.Fatalf("bad event %+v", b)
	}
	if _, err := asBadEvent(&DecodeError{MsgType: 'I', Err: ErrProtocol, Detail: "x"}); err == nil {
		t.Fatal("a protocol error became a bad event")
	}
}

// TestNullPayloadIsTombstone: with NullPayload a NULL payload is an event
// with a nil Payload; an empty one stays non-nil.
func TestNullPayloadIsTombstone(t *testing.T) {
	d := NewDecoder(DecoderConfig{NullPayload: true})
	msgs := decodeAll(t, d, begin(1), outboxRelation(),
		encodeInsert(outboxRel, txt("7"), txt("k"), txt("orders"), null, null, null),
		encodeInsert(outboxRel, txt("8"), txt("k"), txt("orders"), txt(""), null, null))
	if msgs[2].Kind != KindEvent || msgs[2].Event.Payload != nil || msgs[2].Event.ID != 7 {
		t.Fatalf("NULL payload: %v %+v, want an event with a nil payload", msgs[2].Kind, msgs[2].Event)
	}
	if msgs[3].Event.Payload == nil {
		t.Fatal("an empty payload became nil")
	}
}
