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
// outbox_emit function of migration 009 writes them.
const MessagePrefix = "outboxd"

// The content of an outbox message (format version 3, migration 009) is
//
//	v3:<mac>:<xid>:<n>:<topic><n>:<key><n>:<headers><payload>
//
// where <mac> is the 64 lower-case hex digits of HMAC-SHA256(key, "v3:" +
// everything after "<mac>:"), <xid> is the decimal full (64-bit) id of the
// top-level transaction that wrote it (pg_current_xact_id()), each <n> is
// the decimal byte length of the field after it, headers is a JSON object
// (of string values; a null one is no header, see
// Decoder.appendJSONHeaders) and payload is the rest: the text of a jsonb
// value.
// outbox_emit writes it with the key of the table outbox_emit_key, which
// PUBLIC cannot read, so a message that verifies was written by outbox_emit
// in transaction <xid>. It is published only inside that transaction: the
// same content emitted again by anyone who has seen it (WAL, a backup, a
// slot peek) arrives in another transaction and is rejected as replayed.
//
// Format version 2 (migration 007) has no <xid>, "v2:" and a MAC over "v2:"
// + fields: it can be replayed, so it is read only below the LSN at which
// the v3 outbox_emit was installed (MessageKey.V2Until), the backlog the
// old function wrote. Format version 1 (migration 006) has no MAC at all
// and is read only below the LSN at which the key was installed
// (MessageKey.InstalledLSN).
const (
	messageV1 = "v1:"
	messageV2 = "v2:"
	messageV3 = "v3:"
	macHexLen = 2 * sha256.Size
)

// MessageKey is what outbox_emit signs with (table outbox_emit_key), as a
// session read it when it started.
type MessageKey struct {
	// Key signs outbox_emit's messages now. Next is the key the next
	// outbox_emit_rotate_key() makes the signing key, Previous (nil: none)
	// the one the last rotation retired: a session verifies with all
	// three, so the first rotation while it runs loses nothing (a second
	// signs with a key only a new session reads).
	Key, Next, Previous []byte
	// InstalledLSN is the WAL position when the key was installed: format
	// v1 messages below it predate authentication and are accepted.
	InstalledLSN pglogrepl.LSN
	// V2Until is the WAL position when outbox_emit started binding its
	// messages to their transaction (migration 008): format v2 messages
	// below it are accepted.
	V2Until pglogrepl.LSN
	// NextXid is the server's next full transaction id when the session
	// started (0: unknown). No transaction the session decodes is 2^31
	// older than it (the server stops assigning ids well before that), so
	// a v3 message whose xid is older comes from an earlier epoch: the low
	// 32 bits of its xid match by wraparound, not because it was written
	// there.
	NextXid uint64
}

// Why an outboxd message was rejected: the values of Rejected.Reason (and
// of the metric's reason label).
const (
	RejectNotTransactional = "not_transactional"
	RejectBadMAC           = "bad_mac"
	RejectUnauthenticated  = "unauthenticated_v1"
	RejectUnboundV2        = "unbound_v2"
	RejectReplayed         = "replayed"
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

// xidHorizon is how far back from the server's next transaction id a
// transaction still being decoded can lie: half the 32-bit id space, which
// wraparound protection keeps every live transaction within.
const xidHorizon = 1 << 31

// messageVerifier checks the MAC of format-v3 (and old v2) content.
type messageVerifier struct {
	key  *MessageKey
	macs []hash.Hash // Key first: the one almost every message is signed with
	sum  []byte
	hex  [macHexLen]byte
	// minXid is the oldest full xid a v3 message of this session may carry
	// (see MessageKey.NextXid); it rises with every verified message.
	minXid uint64
}

func newMessageVerifier(k *MessageKey) *messageVerifier {
	if k == nil || len(k.Key) == 0 {
		return nil
	}
	v := &messageVerifier{key: k}
	for _, key := range [][]byte{k.Key, k.Next, k.Previous} {
		if len(key) > 0 {
			v.macs = append(v.macs, hmac.New(sha256.New, key))
		}
	}
	v.raiseMinXid(k.NextXid)
	return v
}

func (v *messageVerifier) raiseMinXid(xid uint64) {
	if xid > xidHorizon && xid-xidHorizon > v.minXid {
		v.minXid = xid - xidHorizon
	}
}

// verify checks content c of the message at lsn, written in the
// transaction whose (32-bit) id is xid, and returns its fields (what
// follows the MAC and xid, or v1's "v1:") when it is authentic; otherwise
// the reason it is not, and a detail.
func (v *messageVerifier) verify(c []byte, lsn pglogrepl.LSN, xid uint32) (fields []byte, reason, detail string) {
	switch {
	case v == nil:
		return nil, RejectBadMAC, "outbox_emit's key is not installed"
	case bytes.HasPrefix(c, []byte(messageV3)):
	case bytes.HasPrefix(c, []byte(messageV2)):
		if lsn >= v.key.V2Until {
			return nil, RejectUnboundV2, fmt.Sprintf("format v2 (not bound to its transaction) after outbox_emit moved to v3 at %s", v.key.V2Until)
		}
		fields, ok := v.checkMAC(c, messageV2)
		switch {
		case fields == nil:
			return nil, RejectMalformed, "format v2 without a MAC: " + quote(c)
		case !ok:
			return nil, RejectBadMAC, "the MAC does not verify with outbox_emit's keys"
		}
		return fields, "", ""
	case bytes.HasPrefix(c, []byte(messageV1)):
		if lsn < v.key.InstalledLSN {
			return c[len(messageV1):], "", ""
		}
		return nil, RejectUnauthenticated, fmt.Sprintf("format v1 (no MAC) after the key was installed at %s", v.key.InstalledLSN)
	default:
		return nil, RejectUnknownFormat, "content is neither format v3, v2 nor v1: " + quote(c)
	}
	signed, ok := v.checkMAC(c, messageV3)
	switch {
	case signed == nil:
		return nil, RejectMalformed, "format v3 without a MAC: " + quote(c)
	case !ok:
		return nil, RejectBadMAC, "the MAC does not verify with outbox_emit's keys (or was signed with a key rotated in twice since this session started: restart outboxd)"
	}
	colon := bytes.IndexByte(signed, ':')
	if colon < 1 || colon > 20 {
		return nil, RejectMalformed, "authentic, but without its transaction id: " + quote(c)
	}
	full, err := strconv.ParseUint(string(signed[:colon]), 10, 64)
	switch {
	case err != nil:
		return nil, RejectMalformed, "authentic, but its transaction id does not parse: " + quote(c)
	case uint32(full) != xid:
		return nil, RejectReplayed, fmt.Sprintf("signed in transaction %d, arrived in transaction %d: the content of an earlier message emitted again", full, xid)
	case full < v.minXid:
		return nil, RejectReplayed, fmt.Sprintf("signed in transaction %d, an earlier xid epoch than the server's (this session decodes nothing older than %d): emitted again after the xid wrapped around", full, v.minXid)
	}
	v.raiseMinXid(full)
	return signed[colon+1:], "", ""
}

// checkMAC reports whether content c of format version (its prefix) carries
// a valid MAC under one of the keys, and returns what the MAC covers after
// the version; nil when c has no room for a MAC.
func (v *messageVerifier) checkMAC(c []byte, version string) (signed []byte, ok bool) {
	rest := c[len(version):]
	if len(rest) < macHexLen+1 || rest[macHexLen] != ':' {
		return nil, false
	}
	signed = rest[macHexLen+1:]
	for _, m := range v.macs {
		m.Reset()
		m.Write([]byte(version))
		m.Write(signed)
		v.sum = m.Sum(v.sum[:0])
		hex.Encode(v.hex[:], v.sum)
		if subtle.ConstantTimeCompare(v.hex[:], rest[:macHexLen]) == 1 {
			return signed, true
		}
	}
	return signed, false
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
	fields, reason, detail := d.verifier.verify(w.content, lsn, d.xid)
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
	ev.ID, ev.IDIsLSN = int64(lsn), true
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
