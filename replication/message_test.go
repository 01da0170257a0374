package replication

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"testing"
)

// testKey is a MessageKey installed at LSN 0x1000, whose v3 outbox_emit was
// installed at 0x3000, read by a session that started when the server's
// next transaction id was 0x10.
var testKey = &MessageKey{Key: bytes.Repeat([]byte{0xA5}, 32), Next: bytes.Repeat([]byte{0x5A}, 32),
	InstalledLSN: 0x1000, V2Until: 0x3000, NextXid: 0x10}

// testXid is the transaction the tests' messages are written in (begin(1)).
const testXid = 1

func fieldsOf(topic, key, headers, payload string) string {
	return fmt.Sprintf("%d:%s%d:%s%d:%s%s", len(topic), topic, len(key), key, len(headers), headers, payload)
}

// emitContent is what outbox_emit (migration 008) writes for these
// arguments with testKey in transaction testXid.
func emitContent(topic, key, headers, payload string) []byte {
	return signedV3(testKey.Key, testXid, fieldsOf(topic, key, headers, payload))
}

// signedV3 is format v3 content: the MAC of "v3:<xid>:"+fields under key.
func signedV3(key []byte, xid uint64, fields string) []byte {
	return signedAs("v3:", key, strconv.FormatUint(xid, 10)+":"+fields)
}

// signed is format v2 content: the MAC of "v2:"+fields under key.
func signed(key []byte, fields string) []byte { return signedAs("v2:", key, fields) }

func signedAs(version string, key []byte, body string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(version + body))
	return []byte(version + hex.EncodeToString(m.Sum(nil)) + ":" + body)
}

// emitContentV1 is what outbox_emit of migration 006 wrote.
func emitContentV1(topic, key, headers, payload string) []byte {
	return []byte("v1:" + fieldsOf(topic, key, headers, payload))
}

func keyedDecoder() *Decoder { return NewDecoder(DecoderConfig{Messages: true, MessageKey: testKey}) }

func TestDecodeOutboxMessages(t *testing.T) {
	d := keyedDecoder()
	const lsn = 0x153C478
	msgs := decodeAll(t, d, begin(1),
		encodeMessage(true, lsn, MessagePrefix, emitContent("orders", "order-42", `{"traceparent": "00-a-b-01"}`, `{"n": 1}`)),
		encodeMessage(true, lsn+0x40, "someone-else", []byte("not ours")),
		encodeMessage(true, lsn+0x80, MessagePrefix, emitContent("", "k:with:colons", `{}`, ``)),
		commit())
	want := Event{ID: lsn, Topic: "orders", AggregateID: "order-42", Payload: []byte(`{"n": 1}`),
		Headers: []Header{{Key: "traceparent", Value: "00-a-b-01"}}}
	if msgs[1].Kind != KindEvent {
		t.Fatalf("outboxd message: Kind %v (%+v), want event", msgs[1].Kind, msgs[1].Rejected)
	}
	if s := diffEvent(msgs[1].Event, want); s != "" {
		t.Error(s)
	}
	if !msgs[1].Event.IDIsLSN {
		t.Error("a message's event does not say its id is an LSN: it would count as a row id")
	}
	if msgs[2].Kind != KindNone {
		t.Errorf("message of another prefix: Kind %v, want none", msgs[2].Kind)
	}
	if s := diffEvent(msgs[3].Event, Event{ID: lsn + 0x80, AggregateID: "k:with:colons", Payload: []byte{}}); s != "" {
		t.Error(s)
	}
	// Without Messages, even outboxd's messages mean nothing.
	off := NewDecoder(DecoderConfig{MessageKey: testKey})
	if m := decodeAll(t, off, begin(1), encodeMessage(true, lsn, MessagePrefix, emitContent("t", "k", "{}", "{}")))[1]; m.Kind != KindNone {
		t.Errorf("messages off: Kind %v, want none", m.Kind)
	}
}

// TestDecodeOutboxMessageV1BeforeKey: an unauthenticated v1 message is an
// event only below the LSN where the key was installed (the old
// outbox_emit's backlog), rejected at or above it.
func TestDecodeOutboxMessageV1BeforeKey(t *testing.T) {
	d := keyedDecoder()
	msgs := decodeAll(t, d, begin(1),
		encodeMessage(true, testKey.InstalledLSN-1, MessagePrefix, emitContentV1("t", "k", "{}", `{"old": 1}`)),
		encodeMessage(true, testKey.InstalledLSN, MessagePrefix, emitContentV1("t", "k", "{}", `{"forged": 1}`)),
		commit())
	if msgs[1].Kind != KindEvent || string(msgs[1].Event.Payload) != `{"old": 1}` {
		t.Errorf("v1 before the key: %v %+v, want the event", msgs[1].Kind, msgs[1].Event)
	}
	if msgs[2].Kind != KindRejected || msgs[2].Rejected.Reason != RejectUnauthenticated {
		t.Errorf("v1 after the key: %v %+v, want rejected %s", msgs[2].Kind, msgs[2].Rejected, RejectUnauthenticated)
	}
}

// TestDecodeOutboxMessageRejected: whatever else carries outboxd's prefix
// is KindRejected with its LSN and a reason, never an error, and the
// transaction goes on.
func TestDecodeOutboxMessageRejected(t *testing.T) {
	good := fieldsOf("t", "k", "{}", "{}")
	otherKey := bytes.Repeat([]byte{1}, 32)
	forgedMAC := signed(otherKey, good)
	tampered := bytes.Clone(emitContent("t", "k", "{}", `{"amount": 1}`))
	tampered[len(tampered)-2] = '9'
	for _, tt := range []struct {
		name   string
		msg    []byte
		reason string
	}{
		{"non-transactional", encodeMessage(false, 0x2010, MessagePrefix, emitContent("t", "k", "{}", "{}")), RejectNotTransactional},
		{"garbage", encodeMessage(true, 0x2010, MessagePrefix, []byte("v1:garbage")), RejectUnauthenticated},
		{"unknown version", encodeMessage(true, 0x2010, MessagePrefix, []byte("v9:1:t1:k2:{}{}")), RejectUnknownFormat},
		{"v3 without MAC", encodeMessage(true, 0x2010, MessagePrefix, []byte("v3:1:"+good)), RejectMalformed},
		{"v3 MAC of another key", encodeMessage(true, 0x2010, MessagePrefix, signedV3(otherKey, testXid, good)), RejectBadMAC},
		{"authentic, xid not a number", encodeMessage(true, 0x2010, MessagePrefix, signedAs("v3:", testKey.Key, "x:"+good)), RejectMalformed},
		{"empty", encodeMessage(true, 0x2010, MessagePrefix, nil), RejectUnknownFormat},
		{"v2 without MAC", encodeMessage(true, 0x2010, MessagePrefix, []byte("v2:"+good)), RejectMalformed},
		{"v2 MAC of another key", encodeMessage(true, 0x2010, MessagePrefix, forgedMAC), RejectBadMAC},
		{"tampered payload", encodeMessage(true, 0x2010, MessagePrefix, tampered), RejectBadMAC},
		{"upper-case MAC", encodeMessage(true, 0x2010, MessagePrefix, append([]byte("v3:"), bytes.ToUpper(emitContent("t", "k", "{}", "{}")[3:])...)), RejectBadMAC},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := keyedDecoder()
			msgs := decodeAll(t, d, begin(1), tt.msg, outboxRelation(), outboxInsert(1, "a"), commit())
			m := msgs[1]
			if m.Kind != KindRejected || m.Rejected.Reason != tt.reason || m.Rejected.LSN != 0x2010 {
				t.Fatalf("got %v %+v, want rejected at 0/2010 for %s", m.Kind, m.Rejected, tt.reason)
			}
			if msgs[3].Kind != KindEvent || msgs[4].Kind != KindCommit {
				t.Fatalf("the transaction did not go on: %v, %v", msgs[3].Kind, msgs[4].Kind)
			}
		})
	}
	// Without a key every outboxd message is rejected.
	d := NewDecoder(DecoderConfig{Messages: true})
	if m := decodeAll(t, d, begin(1), encodeMessage(true, 0x10, MessagePrefix, emitContent("t", "k", "{}", "{}")))[1]; m.Kind != KindRejected {
		t.Fatalf("no key: Kind %v, want rejected", m.Kind)
	}
	d = keyedDecoder()
	if _, err := d.Decode(encodeMessage(true, 0x10, MessagePrefix, []byte("v1:")[:2])[:12]); !errors.Is(err, ErrProtocol) {
		t.Fatalf("truncated message: err = %v, want ErrProtocol", err)
	}
}

// FuzzDecodeMessage: any content of an outboxd message is either rejected
// (never an error: nobody can stop the stream with a message) or, only when
// its MAC verifies, decodes to an event whose fields, written back, give
// the content again.
func FuzzDecodeMessage(f *testing.F) {
	f.Add(emitContent("orders", "k", `{"a": "b"}`, `{"n": 1}`), false)
	f.Add([]byte("v1:0:0:2:{}"), true)
	f.Add([]byte("v1:3:abc"), false)
	f.Add([]byte("v3:0000000000000000000000000000000000000000000000000000000000000000:1:1:t1:k2:{}{}"), false)
	f.Add([]byte("1:t1:k2:{}{}"), false)
	f.Fuzz(func(t *testing.T, content []byte, sign bool) {
		if sign {
			// Fields the fuzzer chose, with a valid MAC: exercises the
			// parser behind the verifier.
			content = signedV3(testKey.Key, testXid, string(content))
		}
		d := keyedDecoder()
		decodeAll(t, d, begin(testXid))
		const lsn = 0x3010 // above InstalledLSN and V2Until: v1 and v2 are rejected
		m, err := d.Decode(encodeMessage(true, lsn, MessagePrefix, content))
		if err != nil {
			t.Fatalf("content %q: error %v, want an event or a rejection", content, err)
		}
		if m.Kind == KindRejected {
			if m.Rejected.LSN != lsn || m.Rejected.Reason == "" {
				t.Fatalf("rejection %+v", m.Rejected)
			}
			return
		}
		if m.Kind == KindBad {
			// Only authentic content that is not an event is bad.
			if !sign || m.Bad.Reason == "" || m.Bad.ID != strconv.FormatUint(lsn, 10) {
				t.Fatalf("content %q: bad event %+v", content, m.Bad)
			}
			return
		}
		if m.Kind != KindEvent {
			t.Fatalf("Kind %v", m.Kind)
		}
		ev := m.Event
		if !bytes.Equal(signedAs("v3:", testKey.Key, string(content[3+macHexLen+1:])), content) {
			t.Fatalf("content %q became an event without a valid MAC", content)
		}
		// Lengths may have leading zeros; the fields come in order.
		body := content[3+macHexLen+1:]
		xid, body, _ := bytes.Cut(body, []byte(":"))
		if n, err := strconv.ParseUint(string(xid), 10, 64); err != nil || uint32(n) != testXid {
			t.Fatalf("content %q of transaction %q became an event in transaction %d", content, xid, testXid)
		}
		i := bytes.Index(body, []byte(ev.Topic))
		j := bytes.Index(body[max(i, 0)+len(ev.Topic):], []byte(ev.AggregateID))
		if ev.ID != lsn || i < 0 || j < 0 || !bytes.HasSuffix(content, ev.Payload) {
			t.Fatalf("content %q decoded to %+v", content, ev)
		}
	})
}

// TestDecodeOutboxMessageReplayed: content outbox_emit signed in one
// transaction is an event there and rejected as replayed in any other —
// emitted again by someone who saw it, it carries the same MAC and xid.
func TestDecodeOutboxMessageReplayed(t *testing.T) {
	const written = 0x2a
	content := signedV3(testKey.Key, written, fieldsOf("t", "k", "{}", `{"paid": 1}`))
	d := keyedDecoder()
	msgs := decodeAll(t, d,
		begin(written), encodeMessage(true, 0x4000, MessagePrefix, content), commit(),
		begin(written+1), encodeMessage(true, 0x5000, MessagePrefix, content), commit())
	if msgs[1].Kind != KindEvent || string(msgs[1].Event.Payload) != `{"paid": 1}` {
		t.Fatalf("in its own transaction: %v %+v, want the event", msgs[1].Kind, msgs[1].Rejected)
	}
	if m := msgs[4]; m.Kind != KindRejected || m.Rejected.Reason != RejectReplayed || m.Rejected.LSN != 0x5000 {
		t.Fatalf("in another transaction: %v %+v, want rejected %s", m.Kind, m.Rejected, RejectReplayed)
	}

	// The full xid's low 32 bits are what pgoutput's Begin carries: the
	// same 32 bits in a later epoch match, and only the epoch check tells
	// a replay after wraparound from the original.
	const epoch = 1 << 32
	now := &MessageKey{Key: testKey.Key, V2Until: testKey.V2Until, NextXid: 3*epoch + 100}
	d = NewDecoder(DecoderConfig{Messages: true, MessageKey: now})
	f := fieldsOf("t", "k", "{}", "{}")
	msgs = decodeAll(t, d, begin(written),
		encodeMessage(true, 0x4000, MessagePrefix, signedV3(testKey.Key, 2*epoch+written, f)),
		encodeMessage(true, 0x4100, MessagePrefix, signedV3(testKey.Key, 3*epoch+written, f)),
		commit())
	if m := msgs[1]; m.Kind != KindRejected || m.Rejected.Reason != RejectReplayed {
		t.Errorf("an epoch before the server's: %v %+v, want rejected %s", m.Kind, m.Rejected, RejectReplayed)
	}
	if m := msgs[2]; m.Kind != KindEvent {
		t.Errorf("the server's epoch: %v %+v, want the event", m.Kind, m.Rejected)
	}
	// Without the server's next xid, each verified message bounds the
	// epochs after it.
	unknown := &MessageKey{Key: testKey.Key, V2Until: testKey.V2Until}
	d = NewDecoder(DecoderConfig{Messages: true, MessageKey: unknown})
	msgs = decodeAll(t, d, begin(written),
		encodeMessage(true, 0x4000, MessagePrefix, signedV3(testKey.Key, 5*epoch+written, f)),
		encodeMessage(true, 0x4100, MessagePrefix, signedV3(testKey.Key, 4*epoch+written, f)),
		commit())
	if msgs[1].Kind != KindEvent || msgs[2].Kind != KindRejected || msgs[2].Rejected.Reason != RejectReplayed {
		t.Errorf("after a verified message of epoch 5, one of epoch 4: %v, %v %+v; want event, rejected %s",
			msgs[1].Kind, msgs[2].Kind, msgs[2].Rejected, RejectReplayed)
	}
}

// TestDecodeOutboxMessageV2BeforeV3: v2 (MAC, no xid) is an event only
// below the LSN where the v3 outbox_emit was installed, rejected at or
// above it — whatever its MAC.
func TestDecodeOutboxMessageV2BeforeV3(t *testing.T) {
	d := keyedDecoder()
	v2 := signed(testKey.Key, fieldsOf("t", "k", "{}", `{"old": 2}`))
	msgs := decodeAll(t, d, begin(7),
		encodeMessage(true, testKey.V2Until-1, MessagePrefix, v2),
		encodeMessage(true, testKey.V2Until, MessagePrefix, v2),
		commit())
	if msgs[1].Kind != KindEvent || string(msgs[1].Event.Payload) != `{"old": 2}` {
		t.Errorf("v2 before v3: %v %+v, want the event", msgs[1].Kind, msgs[1].Rejected)
	}
	if msgs[2].Kind != KindRejected || msgs[2].Rejected.Reason != RejectUnboundV2 {
		t.Errorf("v2 after v3: %v %+v, want rejected %s", msgs[2].Kind, msgs[2].Rejected, RejectUnboundV2)
	}
}

// TestDecodeOutboxMessageRotatedKeys: a session verifies with the key, the
// one the next rotation promotes and the one the last retired; a key it
// never read is a bad MAC.
func TestDecodeOutboxMessageRotatedKeys(t *testing.T) {
	prev := bytes.Repeat([]byte{0x11}, 32)
	k := &MessageKey{Key: testKey.Key, Next: testKey.Next, Previous: prev, V2Until: testKey.V2Until}
	d := NewDecoder(DecoderConfig{Messages: true, MessageKey: k})
	f := fieldsOf("t", "k", "{}", "{}")
	msgs := decodeAll(t, d, begin(testXid),
		encodeMessage(true, 0x4000, MessagePrefix, signedV3(k.Key, testXid, f)),
		encodeMessage(true, 0x4100, MessagePrefix, signedV3(k.Next, testXid, f)),
		encodeMessage(true, 0x4200, MessagePrefix, signedV3(prev, testXid, f)),
		encodeMessage(true, 0x4300, MessagePrefix, signedV3(bytes.Repeat([]byte{0x22}, 32), testXid, f)),
		commit())
	for i, want := range []Kind{KindEvent, KindEvent, KindEvent, KindRejected} {
		if msgs[1+i].Kind != want {
			t.Errorf("message %d: %v %+v, want %v", i, msgs[1+i].Kind, msgs[1+i].Rejected, want)
		}
	}
}
