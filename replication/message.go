package replication

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// MessagePrefix is the prefix of the logical decoding messages that are
// outbox events: pg_logical_emit_message(true, 'outboxd', content), as the
// outbox_emit function of migration 007 writes them.
const MessagePrefix = "outboxd"

// The content of an outbox message (format version 2, migration 007) is
//
//	v2:<mac>:<n>:<topic><n>:<key><n>:<headers><payload>
//
// where <mac> is the 64 lower-case hex digits of HMAC-SHA256(key, "v2:" +
// everything after "<mac>:"), each <n> is the decimal byte length of the
// field after it, headers is a JSON object (of string values; a null one
// is no header, see Decoder.appendJSONHeaders) and payload is
// the rest: the text of a jsonb value. outbox_emit writes it with the key of
// the table outbox_emit_key, which PUBLIC cannot read, so a message that
// verifies was written by outbox_emit.
//
// Format version 1 (migration 006) is the same without "<mac>:" and with
// "v1:": nothing proves who wrote it, so it is read only below the LSN at
// which the key was installed (MessageKey.InstalledLSN): the backlog the
// old outbox_emit wrote before the upgrade.
const (
	messageV1 = "v1:"
	messageV2 = "v2:"
	macHexLen = 2 * sha256.Size
)

// MessageKey is outbox_emit's MAC key (table outbox_emit_key).
type MessageKey struct {
	Key []byte
	// InstalledLSN is the WAL position when the key was installed: format
	// v1 messages below it predate authentication and are accepted.
	InstalledLSN pglogrepl.LSN
}

// Why an outboxd message was rejected: the values of Rejected.Reason (and
// of the metric's reason label).
const (
	RejectNotTransactional = "not_transactional"
	RejectBadMAC           = "bad_mac"
	RejectUnauthenticated  = "unauthenticated_v1"
	RejectUnknownFormat    = "unknown_format"
	RejectMalformed        = "malformed"
)

// Rejected is a logical decoding message with outboxd's prefix that was not
// proven to come from outbox_emit. It is never published and never stops the
// stream: the consumer counts, logs and skips it.
type Rejected struct {
	LSN    pglogrepl.LSN
	Reason string // one of the Reject* constants
	Detail string
}

// messageVerifier checks the MAC of format-v2 content.
type messageVerifier struct {
	key *MessageKey
	mac hash.Hash
	sum []byte
	hex [macHexLen]byte
}

func newMessageVerifier(k *MessageKey) *messageVerifier {
	if k == nil || len(k.Key) == 0 {
		return nil
	}
	return &messageVerifier{key: k, mac: hmac.New(sha256.New, k.Key)}
}

// verify checks content c of the message at lsn and returns its fields
// (what follows the MAC, or v1's "v1:") when it is authentic; otherwise
// the reason it is not, and a detail.
func (v *messageVerifier) verify(c []byte, lsn pglogrepl.LSN) (fields []byte, reason, detail string) {
	switch {
	case v == nil:
		return nil, RejectBadMAC, "outbox_emit's key is not installed"
	case bytes.HasPrefix(c, []byte(messageV2)):
	case bytes.HasPrefix(c, []byte(messageV1)):
		if lsn < v.key.InstalledLSN {
			return c[len(messageV1):], "", ""
		}
		return nil, RejectUnauthenticated, fmt.Sprintf("format v1 (no MAC) after the key was installed at %s", v.key.InstalledLSN)
	default:
		return nil, RejectUnknownFormat, "content is neither format v2 nor v1: " + quote(c)
	}
	rest := c[len(messageV2):]
	if len(rest) < macHexLen+1 || rest[macHexLen] != ':' {
		return nil, RejectMalformed, "format v2 without a MAC: " + quote(c)
	}
	fields = rest[macHexLen+1:]
	v.mac.Reset()
	v.mac.Write([]byte(messageV2))
	v.mac.Write(fields)
	v.sum = v.mac.Sum(v.sum[:0])
	hex.Encode(v.hex[:], v.sum)
	if subtle.ConstantTimeCompare(v.hex[:], rest[:macHexLen]) != 1 {
		return nil, RejectBadMAC, "the MAC does not verify with outbox_emit's key"
	}
	return fields, "", ""
}

// decodeMessage interprets a logical decoding message ('M'). Messages with
// another prefix, or every message when messages are not enabled, mean
// nothing for the outbox. An outboxd message that is not proven to come
// from outbox_emit is KindRejected, never an error: whoever can emit one
// (PUBLIC, by default) must not be able to stop the stream. One that is
// proven but cannot be an event is KindBad.
func (d *Decoder) decodeMessage(b []byte) (Message, error) {
	if !d.messages {
		return Message{}, nil
	}
	var w logicalMessage
	if err := w.decode(b); err != nil {
		return Message{}, err
	}
	if string(w.prefix) != MessagePrefix {
		return Message{}, nil
	}
	lsn := w.lsn
	reject := func(reason, detail string) (Message, error) {
		return Message{Kind: KindRejected, Rejected: Rejected{LSN: lsn, Reason: reason, Detail: detail}}, nil
	}
	if !w.transactional || !d.inTxn {
		return reject(RejectNotTransactional, "not transactional: outbox_emit never writes such a message")
	}
	fields, reason, detail := d.verifier.verify(w.content, lsn)
	if reason != "" {
		return reject(reason, detail)
	}
	ev, hdrs, bad := d.parseMessageFields(fields)
	if bad != "" {
		// Authentic: outbox_emit wrote it, in a transaction that committed.
		// Skipping it as a forgery would drop a real event without a
		// trace, so it is a bad event: dead-lettered, or halting with the
		// --skip-bad-event that names it.
		return Message{Kind: KindBad, Bad: messageBad(lsn, fields, &ev, hdrs, bad)}, nil
	}
	ev.ID = int64(lsn)
	if ev.Topic != "" {
		ev.Topic = d.intern([]byte(ev.Topic), &d.lastTopic)
	}
	return Message{Kind: KindEvent, Event: ev}, nil
}

// messageBad is the bad event of the authentic outbox message at lsn with
// fields (what follows its MAC) that cannot become an event for reason: its
// id is the outbox-id it would have had, its columns the fields that
// parsed (ev and its headers' text), or the whole of fields when they did
// not.
func messageBad(lsn pglogrepl.LSN, fields []byte, ev *Event, headers []byte, reason string) BadEvent {
	id := strconv.FormatUint(uint64(lsn), 10)
	b := BadEvent{ID: id, Reason: "outbox_emit message id=" + id + ": " + reason}
	if ev.Payload == nil {
		b.Columns = []ColumnText{{Name: "content", Value: bytes.Clone(fields)}}
		return b
	}
	b.Columns = []ColumnText{
		{Name: "topic", Value: []byte(ev.Topic)},
		{Name: "key", Value: []byte(ev.AggregateID)},
		{Name: "headers", Value: bytes.Clone(headers)},
		{Name: "payload", Value: ev.Payload},
	}
	return b
}

// parseMessageFields parses what follows the version (and MAC) of an
// outbox message: <n>:<topic><n>:<key><n>:<headers><payload>. bad says why
// it cannot be an event; ev then holds the fields that parsed, its Payload
// nil when the framing itself did not. headers is the headers field's text.
func (d *Decoder) parseMessageFields(c []byte) (ev Event, headers []byte, bad string) {
	var fields [3][]byte
	for i := range fields {
		colon := bytes.IndexByte(c, ':')
		if colon < 1 || colon > 10 {
			return ev, nil, "its fields do not parse: " + quote(c)
		}
		n, err := strconv.ParseUint(string(c[:colon]), 10, 31)
		if err != nil || uint64(len(c)-colon-1) < n {
			return ev, nil, "its fields do not parse: " + quote(c)
		}
		fields[i] = c[colon+1 : colon+1+int(n)]
		c = c[colon+1+int(n):]
	}
	ev.Topic = string(fields[0])
	ev.AggregateID = string(fields[1])
	ev.Payload = bytes.Clone(c)
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	if ev.Headers, bad = d.appendJSONHeaders(nil, fields[2]); bad != "" {
		return ev, fields[2], "headers " + bad
	}
	return ev, fields[2], ""
}
