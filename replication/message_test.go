package replication

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// emitContent is what outbox_emit writes for these arguments.
func emitContent(topic, key, headers, payload string) []byte {
	return []byte(fmt.Sprintf("v1:%d:%s%d:%s%d:%s%s", len(topic), topic, len(key), key, len(headers), headers, payload))
}

func TestDecodeOutboxMessages(t *testing.T) {
	d := NewDecoder(DecoderConfig{Messages: true})
	const lsn = 0x153C478
	msgs := decodeAll(t, d, begin(1),
		encodeMessage(true, lsn, MessagePrefix, emitContent("orders", "order-42", `{"traceparent": "00-a-b-01"}`, `{"n": 1}`)),
		encodeMessage(true, lsn+0x40, "someone-else", []byte("not ours")),
		encodeMessage(true, lsn+0x80, MessagePrefix, emitContent("", "k:with:colons", `{}`, ``)),
		commit())
	want := Event{ID: lsn, Topic: "orders", AggregateID: "order-42", Payload: []byte(`{"n": 1}`),
		Headers: []Header{{"traceparent", "00-a-b-01"}}}
	if msgs[1].Kind != KindEvent {
		t.Fatalf("outboxd message: Kind %v, want event", msgs[1].Kind)
	}
	if s := diffEvent(msgs[1].Event, want); s != "" {
		t.Error(s)
	}
	if msgs[2].Kind != KindNone {
		t.Errorf("message of another prefix: Kind %v, want none", msgs[2].Kind)
	}
	if s := diffEvent(msgs[3].Event, Event{ID: lsn + 0x80, AggregateID: "k:with:colons", Payload: []byte{}}); s != "" {
		t.Error(s)
	}
	// Without Messages, even outboxd's messages mean nothing.
	off := NewDecoder(DecoderConfig{})
	if m := decodeAll(t, off, begin(1), encodeMessage(true, lsn, MessagePrefix, emitContent("t", "k", "{}", "{}")))[1]; m.Kind != KindNone {
		t.Errorf("messages off: Kind %v, want none", m.Kind)
	}
}

func TestDecodeOutboxMessageErrors(t *testing.T) {
	for _, tt := range []struct {
		name    string
		msg     []byte
		message string
	}{
		{"non-transactional", encodeMessage(false, 0x10, MessagePrefix, emitContent("t", "k", "{}", "{}")), "is not transactional"},
		{"unknown version", encodeMessage(true, 0x10, MessagePrefix, []byte("v2:1:t1:k2:{}{}")), "not outbox_emit's format v1"},
		{"length past the end", encodeMessage(true, 0x10, MessagePrefix, []byte("v1:99:t")), "not outbox_emit's format v1"},
		{"headers not an object", encodeMessage(true, 0x10, MessagePrefix, emitContent("t", "k", "[1]", "{}")), "not outbox_emit's format v1"},
		{"negative length", encodeMessage(true, 0x10, MessagePrefix, []byte("v1:-1:t")), "not outbox_emit's format v1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(DecoderConfig{Messages: true})
			decodeAll(t, d, begin(1))
			_, err := d.Decode(tt.msg)
			if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), tt.message) || !strings.Contains(err.Error(), "at LSN 0/10") {
				t.Fatalf("err = %v, want ErrBadValue naming the LSN and %q", err, tt.message)
			}
		})
	}
	d := NewDecoder(DecoderConfig{Messages: true})
	if _, err := d.Decode(encodeMessage(true, 0x10, MessagePrefix, []byte("v1:")[:2])[:12]); !errors.Is(err, ErrProtocol) {
		t.Fatalf("truncated message: err = %v, want ErrProtocol", err)
	}
}

// FuzzDecodeMessage: any content of an outboxd message either fails with
// ErrBadValue or decodes to an event whose fields, written back in format
// v1, give the content again.
func FuzzDecodeMessage(f *testing.F) {
	f.Add(emitContent("orders", "k", `{"a": "b"}`, `{"n": 1}`))
	f.Add([]byte("v1:0:0:2:{}"))
	f.Add([]byte("v1:3:abc"))
	f.Fuzz(func(t *testing.T, content []byte) {
		d := NewDecoder(DecoderConfig{Messages: true})
		decodeAll(t, d, begin(1))
		m, err := d.Decode(encodeMessage(true, 0x10, MessagePrefix, content))
		if err != nil {
			if !errors.Is(err, ErrBadValue) || m.Kind != KindNone {
				t.Fatalf("err %v (Kind %v), want ErrBadValue and none", err, m.Kind)
			}
			return
		}
		ev := m.Event
		if ev.ID != 0x10 || !bytes.HasPrefix(content, []byte(fmt.Sprintf("v1:%d:%s%d:%s", len(ev.Topic), ev.Topic, len(ev.AggregateID), ev.AggregateID))) ||
			!bytes.HasSuffix(content, ev.Payload) {
			t.Fatalf("content %q decoded to %+v", content, ev)
		}
	})
}
