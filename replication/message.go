package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
)

// MessagePrefix is the prefix of the logical decoding messages that are
// outbox events: pg_logical_emit_message(true, 'outboxd', content), as the
// outbox_emit function of migration 006 writes them.
const MessagePrefix = "outboxd"

// The content of an outbox message (format version 1) is
//
//	v1:<n>:<topic><n>:<key><n>:<headers><payload>
//
// where each <n> is the decimal byte length of the field after it, headers
// is a JSON object of string values and payload is the rest: the text of a
// jsonb value. outbox_emit writes it; nothing else needs to.
const messageV1 = "v1:"

// decodeMessage interprets a logical decoding message ('M'). Messages with
// another prefix, or every message when messages are not enabled, mean
// nothing for the outbox.
func (d *Decoder) decodeMessage(b []byte) (Message, error) {
	if !d.messages {
		return Message{}, nil
	}
	const head = 1 + 1 + 8 // type, flags, LSN
	if len(b) < head {
		return Message{}, truncErr(b)
	}
	flags := b[1]
	lsn := pglogrepl.LSN(binary.BigEndian.Uint64(b[2:]))
	prefix, off, err := readCString(b, head)
	if err != nil {
		return Message{}, err
	}
	n, off, err := readUint32(b, off)
	if err != nil {
		return Message{}, err
	}
	if uint64(n) != uint64(len(b)-off) {
		return Message{}, protoErr(b, off-4, fmt.Sprintf("content claims %d bytes, %d present", n, len(b)-off))
	}
	if string(prefix) != MessagePrefix {
		return Message{}, nil
	}
	bad := func(detail string) error {
		return &DecodeError{MsgType: 'M', Offset: off, Err: ErrBadValue,
			Detail: fmt.Sprintf("outbox message at LSN %s: %s", lsn, detail)}
	}
	if flags&1 == 0 || !d.inTxn {
		return Message{}, bad("is not transactional: it would be published even if its transaction rolled back; emit with outbox_emit (pg_logical_emit_message(true, ...))")
	}
	ev, ok := parseMessageV1(b[off:])
	if !ok {
		return Message{}, bad("content is not outbox_emit's format v1: " + quote(b[off:]))
	}
	ev.ID = int64(lsn)
	if ev.Topic != "" {
		ev.Topic = d.intern([]byte(ev.Topic), &d.lastTopic)
	}
	return Message{Kind: KindEvent, Event: ev}, nil
}

// parseMessageV1 parses the content of a format-v1 outbox message.
func parseMessageV1(c []byte) (Event, bool) {
	var ev Event
	if !bytes.HasPrefix(c, []byte(messageV1)) {
		return ev, false
	}
	c = c[len(messageV1):]
	var fields [3][]byte
	for i := range fields {
		colon := bytes.IndexByte(c, ':')
		if colon < 1 || colon > 10 {
			return ev, false
		}
		n, err := strconv.ParseUint(string(c[:colon]), 10, 31)
		if err != nil || uint64(len(c)-colon-1) < n {
			return ev, false
		}
		fields[i] = c[colon+1 : colon+1+int(n)]
		c = c[colon+1+int(n):]
	}
	ev.Topic = string(fields[0])
	ev.AggregateID = string(fields[1])
	hs, ok := appendJSONHeaders(nil, fields[2])
	if !ok {
		return ev, false
	}
	ev.Headers = hs
	ev.Payload = bytes.Clone(c)
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	return ev, true
}
