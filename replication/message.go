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
	"sync"

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
	v := &messageVerifier{key: k, macs: keyMACs(k)}
	v.raiseMinXid(k.NextXid)
	return v
}

// keyMACs is one HMAC-SHA256 per key of k, Key first.
func keyMACs(k *MessageKey) []hash.Hash {
	var macs []hash.Hash
	for _, key := range [][]byte{k.Key, k.Next, k.Previous} {
		if len(key) > 0 {
			macs = append(macs, hmac.New(sha256.New, key))
		}
	}
	return macs
}

func (v *messageVerifier) raiseMinXid(xid uint64) {
	if xid > xidHorizon && xid-xidHorizon > v.minXid {
		v.minXid = xid - xidHorizon
	}
}

// signedOff is where what the MAC of v2 and v3 content covers (after the
// version) starts: after "vN:<64 hex>:".
const signedOff = len(messageV3) + macHexLen + 1

// maxXidText bounds a v3 xid's digits and the ':' after them.
const maxXidText = 21

// contentCheck is what decides whether an outboxd message is authentic,
// read from its content: by verify from the whole of it, or by a
// contentStream from its first bytes while the rest streams through the
// MACs, for a message too large to hold. One reading and one rule
// (messageVerifier.judge) for both.
type contentCheck struct {
	format string // messageV3, messageV2, messageV1; "" for none of them
	// signed says that "<64 hex>:" follows the version (v2 and v3), macOK
	// that the MAC verifies under one of the keys.
	signed, macOK bool
	// xidEnd says that a v3 message's transaction id (xidText) ends with
	// a ':' within maxXidText bytes after the MAC.
	xidEnd bool
	// fields is where the fields start in the content: after the xid, the
	// MAC or "v1:".
	fields int
	// head is the content's start (all of it, or at least its first
	// contentHeadMax bytes), for details.
	head []byte
}

// formatOf is the format version content c starts with, "" for none.
func formatOf(c []byte) string {
	for _, f := range []string{messageV3, messageV2, messageV1} {
		if bytes.HasPrefix(c, []byte(f)) {
			return f
		}
	}
	return ""
}

// macSigned says whether content starting with head carries a MAC to
// check: format v2 or v3 with room for it. head must hold the first
// signedOff bytes, when the content has them.
func macSigned(head []byte) bool {
	f := formatOf(head)
	return (f == messageV3 || f == messageV2) && len(head) >= signedOff && head[signedOff-1] == ':'
}

// readCheck reads the contentCheck of content starting with head (all of
// it, or its first contentHeadMax bytes), whose MAC's input (macSigned:
// the version, then everything from signedOff on) macs were fed.
func readCheck(head []byte, macs []hash.Hash, sum *[]byte, hexBuf *[macHexLen]byte) contentCheck {
	c := contentCheck{format: formatOf(head), head: head}
	switch {
	case c.format == messageV1:
		c.fields = len(messageV1)
		return c
	case c.format == "" || !macSigned(head):
		return c
	}
	c.signed, c.fields = true, signedOff
	for _, m := range macs {
		*sum = m.Sum((*sum)[:0])
		hex.Encode(hexBuf[:], *sum)
		if subtle.ConstantTimeCompare(hexBuf[:], head[len(c.format):len(c.format)+macHexLen]) == 1 {
			c.macOK = true
			break
		}
	}
	if c.format == messageV3 {
		signed := head[signedOff:]
		if colon := bytes.IndexByte(signed[:min(len(signed), maxXidText)], ':'); colon >= 1 {
			c.xidEnd, c.fields = true, signedOff+colon+1
		}
	}
	return c
}

// xidText is the text of a v3 message's transaction id: what precedes the
// first ':' after the MAC (when xidEnd).
func (c *contentCheck) xidText() []byte { return c.head[signedOff : c.fields-1] }

// check reads what judge needs from the whole content c: its MACs computed
// over c at once (a contentStream computes them as c arrives).
func (v *messageVerifier) check(c []byte) contentCheck {
	if macSigned(c) {
		for _, m := range v.macs {
			m.Reset()
			m.Write(c[:len(messageV3)])
			m.Write(c[signedOff:])
		}
	}
	return readCheck(c, v.macs, &v.sum, &v.hex)
}

// verify checks content c of the message at lsn, written in the
// transaction whose (32-bit) id is xid, and returns its fields (what
// follows the MAC and xid, or v1's "v1:") when it is authentic; otherwise
// the reason it is not, and a detail.
func (v *messageVerifier) verify(c []byte, lsn pglogrepl.LSN, xid uint32) (fields []byte, reason, detail string) {
	if v == nil {
		reason, detail = v.judge(nil, lsn, xid)
		return nil, reason, detail
	}
	chk := v.check(c)
	if reason, detail = v.judge(&chk, lsn, xid); reason != "" {
		return nil, reason, detail
	}
	return c[chk.fields:], "", ""
}

// judge decides on a message at lsn, in the transaction whose (32-bit) id
// is xid, from what its content says (c, nil when there is no verifier):
// "" when it is authentic, otherwise the reason it is not and a detail. An
// authentic v3 message raises minXid.
func (v *messageVerifier) judge(c *contentCheck, lsn pglogrepl.LSN, xid uint32) (reason, detail string) {
	if v == nil {
		return RejectBadMAC, "outbox_emit's key is not installed"
	}
	switch c.format {
	case messageV3:
	case messageV2:
		switch {
		case lsn >= v.key.V2Until:
			return RejectUnboundV2, fmt.Sprintf("format v2 (not bound to its transaction) after outbox_emit moved to v3 at %s", v.key.V2Until)
		case !c.signed:
			return RejectMalformed, "format v2 without a MAC: " + quote(c.head)
		case !c.macOK:
			return RejectBadMAC, "the MAC does not verify with outbox_emit's keys"
		}
		return "", ""
	case messageV1:
		if lsn < v.key.InstalledLSN {
			return "", ""
		}
		return RejectUnauthenticated, fmt.Sprintf("format v1 (no MAC) after the key was installed at %s", v.key.InstalledLSN)
	default:
		return RejectUnknownFormat, "content is neither format v3, v2 nor v1: " + quote(c.head)
	}
	switch {
	case !c.signed:
		return RejectMalformed, "format v3 without a MAC: " + quote(c.head)
	case !c.macOK:
		return RejectBadMAC, "the MAC does not verify with outbox_emit's keys (or was signed with a key rotated in twice since this session started: restart outboxd)"
	case !c.xidEnd:
		return RejectMalformed, "authentic, but without its transaction id: " + quote(c.head)
	}
	full, err := strconv.ParseUint(string(c.xidText()), 10, 64)
	switch {
	case err != nil:
		return RejectMalformed, "authentic, but its transaction id does not parse: " + quote(c.head)
	case uint32(full) != xid:
		return RejectReplayed, fmt.Sprintf("signed in transaction %d, arrived in transaction %d: the content of an earlier message emitted again", full, xid)
	case full < v.minXid:
		return RejectReplayed, fmt.Sprintf("signed in transaction %d, an earlier xid epoch than the server's (this session decodes nothing older than %d): emitted again after the xid wrapped around", full, v.minXid)
	}
	v.raiseMinXid(full)
	return "", ""
}

// contentHeadMax is how much of a streamed message's content a
// contentStream holds: its version, MAC and xid, and room for its topic
// and key, which its bad event keeps when they fit.
const contentHeadMax = 4 << 10

// contentStream reads the content of an outboxd message too large to hold
// as it arrives: it keeps the first contentHeadMax bytes and feeds what
// the MAC covers to one MAC per key, so that its contentCheck is the one
// verify would read from the whole content.
type contentStream struct {
	macs   []hash.Hash
	head   []byte
	n      int64 // content bytes written
	signed bool
	sum    []byte
	hex    [macHexLen]byte
}

func newContentStream(k *MessageKey) *contentStream {
	return &contentStream{macs: keyMACs(k), head: make([]byte, 0, contentHeadMax)}
}

// reset starts a message.
func (s *contentStream) reset() {
	s.head, s.n, s.signed = s.head[:0], 0, false
}

// write takes the next bytes of the content.
func (s *contentStream) write(p []byte) {
	if room := contentHeadMax - len(s.head); room > 0 {
		s.head = append(s.head, p[:min(room, len(p))]...)
	}
	start := s.n
	s.n += int64(len(p))
	if s.n < int64(signedOff) {
		return
	}
	if start < int64(signedOff) { // the head now holds version and MAC
		if s.signed = macSigned(s.head); s.signed {
			for _, m := range s.macs {
				m.Reset()
				m.Write(s.head[:len(messageV3)])
			}
		}
	}
	if s.signed {
		rest := p[max(0, int64(signedOff)-start):]
		for _, m := range s.macs {
			m.Write(rest)
		}
	}
}

// check is the contentCheck of the content written; it aliases the
// stream's head until the next reset.
func (s *contentStream) check() contentCheck {
	return readCheck(s.head, s.macs, &s.sum, &s.hex)
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
	var big *streamedMessage
	if len(w.content) == 0 && d.streamed != nil {
		big = d.streamed.take(lsn)
	}
	if !w.transactional || !d.inTxn {
		return reject(RejectNotTransactional, "not transactional: outbox_emit never writes such a message")
	}
	if big != nil {
		// Too large to publish, so the frame filter read it through the
		// MACs as it arrived rather than hold it: the same rule decides.
		if reason, detail := d.verifier.judge(&big.check, lsn, d.xid); reason != "" {
			return reject(reason, detail)
		}
		return Message{Kind: KindBad, Bad: big.bad()}, nil
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
		var ok bool
		if fields[i], c, ok = nextField(c); !ok {
			return ev, nil, "its fields do not parse: " + quote(c)
		}
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

// nextField splits a length-prefixed field (<n>:<n bytes>) off c.
func nextField(c []byte) (field, rest []byte, ok bool) {
	colon := bytes.IndexByte(c, ':')
	if colon < 1 || colon > 10 {
		return nil, c, false
	}
	n, err := strconv.ParseUint(string(c[:colon]), 10, 31)
	if err != nil || uint64(len(c)-colon-1) < n {
		return nil, c, false
	}
	return c[colon+1 : colon+1+int(n)], c[colon+1+int(n):], true
}

// streamedMessage is an outboxd message whose content was larger than can
// be published (the producer's max message bytes), as the frame filter
// read it: passed on with empty content, its content's check kept here
// for the decoder.
type streamedMessage struct {
	lsn   pglogrepl.LSN
	size  int64 // the content's length
	limit int   // the max message bytes it exceeds
	check contentCheck
}

// bad is the bad event of the authentic streamed message: its id and the
// topic and key when they fit in the head held, never the payload (it was
// not kept, and could not be published anyway).
func (m *streamedMessage) bad() BadEvent {
	id := strconv.FormatUint(uint64(m.lsn), 10)
	b := BadEvent{ID: id, Reason: fmt.Sprintf("outbox_emit message id=%s: its content of %d bytes is larger than --kafka-max-message-bytes (%d)", id, m.size, m.limit)}
	topic, rest, ok := nextField(m.check.head[m.check.fields:])
	if !ok {
		return b
	}
	b.Columns = append(b.Columns, ColumnText{Name: "topic", Value: bytes.Clone(topic)})
	if key, _, ok := nextField(rest); ok {
		b.Columns = append(b.Columns, ColumnText{Name: "key", Value: bytes.Clone(key)})
	}
	return b
}

// maxStreamed bounds the streamed messages waiting for the decoder: the
// filter passes each on as it records it, and the reader between them
// buffers few messages, so only a bug would fill it.
const maxStreamed = 1024

// streamedMessages hands the streamed messages from a connection's frame
// filter (its reading goroutine) to the session's decoder, in stream order.
type streamedMessages struct {
	mu sync.Mutex
	q  []streamedMessage
}

func (s *streamedMessages) push(m streamedMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.q) == maxStreamed {
		s.q = s.q[1:]
	}
	s.q = append(s.q, m)
}

// take removes and returns the message at lsn (nil: none), with the ones
// before it: a message with empty content at another LSN was sent so. No
// two messages share an LSN, so nobody can claim another's check.
func (s *streamedMessages) take(lsn pglogrepl.LSN) *streamedMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.q {
		if s.q[i].lsn == lsn {
			m := s.q[i]
			s.q = s.q[i+1:]
			return &m
		}
	}
	return nil
}
