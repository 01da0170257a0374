package replication

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
)

// ForeignMessage is a logical decoding message with another prefix than
// outboxd's whose content the stream discarded as it arrived, unread: the
// decoder saw it with empty content.
type ForeignMessage struct {
	LSN           pglogrepl.LSN
	Transactional bool
	// Prefix is the message's prefix, cut to maxForeignPrefix bytes when
	// PrefixCut says so.
	Prefix    string
	PrefixCut bool
	// Size is the content's length in bytes, as the server sent it.
	Size int64
}

// maxForeignPrefix bounds the prefix the filter holds: a longer one is not
// outboxd's, and only its first maxForeignPrefix bytes are kept.
const maxForeignPrefix = 256

// Offsets in the body of a CopyData carrying XLogData ('w', start, WAL end,
// send time) whose WAL data is a pgoutput logical decoding message ('M',
// flags, LSN, prefix, content length, content), protocol version 1: no
// xid, as outboxd does not stream in-progress transactions.
const (
	xlogHeadLen = 1 + 8 + 8 + 8
	msgTypeOff  = xlogHeadLen
	msgFlagsOff = msgTypeOff + 1
	msgLSNOff   = msgFlagsOff + 1
	msgPrefOff  = msgLSNOff + 8
)

// filterState says what the next input bytes are.
type filterState uint8

const (
	// A backend message's header: type and length (5 bytes).
	stateHead filterState = iota
	// The rest of a message's body, passed on unchanged.
	statePass
	// The head of a CopyData of the replication stream, held until it is
	// known whether it is a foreign logical decoding message.
	statePeek
	// A foreign message's prefix beyond maxForeignPrefix, dropped up to
	// and including its NUL.
	stateDropPrefix
	// A foreign message's content length (4 bytes), after a long prefix.
	stateLength
	// A foreign message's content, dropped.
	stateDrop
	// The content of an outboxd message too large to publish, read through
	// its MAC check and dropped.
	stateOwn
)

// frameFilter reads the backend's side of a replication connection and
// passes it on unchanged, with one exception: once the server has started
// the copy-both stream (CopyBothResponse), the content of each logical
// decoding message whose prefix is not outboxd's is dropped as it arrives,
// never held, and the message goes on with the same header and empty
// content. Anyone who can execute pg_logical_emit_message (PUBLIC by
// default) can put such a message of up to 1 GB into the stream, and
// pgconn reads every message whole into memory before the decoder sees its
// prefix. Messages with outboxd's own prefix pass whole, unless
// streamOwn was called and their content is larger than can be published
// (the producer's max message bytes): that content is read through its MAC
// check (contentStream) as it arrives and dropped too, the message goes on
// with empty content, and its check waits in the streamedMessages for the
// decoder. Its MAC covers the whole content, so holding the content to
// check it would let anyone who can emit a message with outboxd's prefix
// size outboxd's memory.
//
// It holds at most a message's header and its first bytes (up to the
// prefix and content length), and of a streamed outboxd message the first
// contentHeadMax bytes of its content, so its memory does not depend on
// what it reads. Input may arrive in chunks split anywhere. Malformed frames are
// passed on unchanged when nothing of them was dropped yet, for the
// decoder to report; a message that turns out malformed after part of it
// was dropped is an error, as is a negative message length. After an
// error every Read returns it.
//
// Not safe for concurrent use; pgconn reads from one goroutine at a time.
type frameFilter struct {
	r   io.Reader
	own string
	// onDrop, when set, is called for each foreign message when its
	// content starts to be dropped.
	onDrop func(ForeignMessage)

	buf  []byte // read buffer
	in   []byte // unconsumed input: a tail of buf
	out  []byte // output to return before anything else
	outb []byte // out's storage
	rerr error  // the reader's error, returned once in is used up
	err  error  // sticky: the stream is broken

	// big, once set, streams outboxd messages larger than it allows.
	big    atomic.Pointer[ownStreaming]
	ownMsg streamedMessage // the one being streamed

	state    filterState
	copyBoth bool
	left     int64  // bytes of the current message's body not yet read
	hold     []byte // held input: a header, or a CopyData's head
	foreign  ForeignMessage
}

// newFrameFilter filters r, keeping messages with prefix own whole.
func newFrameFilter(r io.Reader, own string, onDrop func(ForeignMessage)) *frameFilter {
	return &frameFilter{r: r, own: own, onDrop: onDrop, buf: make([]byte, 32<<10),
		hold: make([]byte, 0, 5+msgPrefOff+maxForeignPrefix+1+4)}
}

// ownStreaming is how a frame filter reads outboxd messages too large to
// publish: content larger than over (limit + ownSlack) goes through cs,
// its check to q.
type ownStreaming struct {
	limit int
	over  int64
	cs    *contentStream
	q     *streamedMessages
}

// ownSlack is what an outboxd message's content holds besides what its
// record carries (the version, MAC, xid, field lengths, the topic and the
// headers' JSON syntax): a content larger than the max message bytes by
// more than it cannot become a record of at most that size.
const ownSlack = 64 << 10

// streamOwn makes the filter stream, rather than pass whole, the outboxd
// messages whose content is larger than limit + ownSlack bytes, verifying
// them with the keys of k; q receives their checks. Call it before
// START_REPLICATION: a session reads the key on the connection it filters.
func (f *frameFilter) streamOwn(k *MessageKey, limit int, q *streamedMessages) {
	f.big.Store(&ownStreaming{limit: limit, over: int64(limit) + ownSlack, cs: newContentStream(k), q: q})
}

// Read implements io.Reader. It fills p as far as the input already read
// allows, and reads from the source only when it has nothing for p.
func (f *frameFilter) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(f.out) > 0 {
			k := copy(p[n:], f.out)
			f.out = f.out[k:]
			n += k
			continue
		}
		if f.err != nil {
			break
		}
		if len(f.in) > 0 {
			before := len(f.in)
			k := f.step(p[n:])
			n += k
			if k == 0 && len(f.in) == before && len(f.out) == 0 && f.err == nil {
				// A state that waits for input it cannot take would spin.
				f.err = fmt.Errorf("replication: frame filter stuck in state %d: a bug in outboxd; the session restarts", f.state)
			}
			continue
		}
		if n > 0 {
			return n, nil // what there is, rather than wait for more
		}
		if err := f.rerr; err != nil {
			// Once, not sticky: a read deadline's timeout belongs to that
			// read, and the next one goes on where this one stopped.
			f.rerr = nil
			return 0, err
		}
		if f.state == statePass {
			// Nothing to look at: read straight into p.
			k, err := f.r.Read(p[:min(int64(len(p)), f.left)])
			f.left -= int64(k)
			if f.left == 0 {
				f.state = stateHead
			}
			if k > 0 || err != nil {
				return k, err
			}
			continue
		}
		k, err := f.r.Read(f.buf)
		f.in, f.rerr = f.buf[:k], err
	}
	if n == 0 && f.err != nil {
		return 0, f.err
	}
	return n, nil
}

// step consumes input in the current state and returns the bytes it
// wrote to p; it may instead set f.out or f.err, or consume input
// without output.
func (f *frameFilter) step(p []byte) int {
	switch f.state {
	case stateHead:
		f.take(5)
		if len(f.hold) < 5 {
			return 0
		}
		typ, n := f.hold[0], int32(binary.BigEndian.Uint32(f.hold[1:5]))
		if n < 4 {
			f.err = fmt.Errorf("replication: %w: server message %q with length %d: the connection is corrupt; the session restarts", ErrProtocol, typ, n)
			return 0
		}
		f.left = int64(n) - 4
		if f.copyBoth && typ == 'd' {
			f.state = statePeek
			return 0
		}
		switch typ {
		case 'W': // CopyBothResponse: START_REPLICATION streams
			f.copyBoth = true
		case 'c', 'E', 'Z': // CopyDone, ErrorResponse, ReadyForQuery
			f.copyBoth = false
		}
		f.passHeld()
		return 0
	case statePass:
		n := copy(p[:min(int64(len(p)), f.left)], f.in)
		f.in = f.in[n:]
		f.left -= int64(n)
		if f.left == 0 {
			f.state = stateHead
		}
		return n
	case statePeek:
		f.peek()
		return 0
	case stateDropPrefix:
		n := int(min(int64(len(f.in)), f.left))
		nul := -1
		for i, c := range f.in[:n] {
			if c == 0 {
				nul = i
				break
			}
		}
		if nul >= 0 {
			n = nul + 1
			f.state = stateLength
		}
		f.in = f.in[n:]
		f.left -= int64(n)
		if f.state == stateDropPrefix && f.left == 0 {
			f.err = fmt.Errorf("replication: %w: logical decoding message at %s: its prefix has no end: the connection is corrupt; the session restarts", ErrProtocol, f.foreign.LSN)
		}
		return 0
	case stateLength:
		const mark = 5 + msgPrefOff + maxForeignPrefix // the cut prefix held
		f.take(mark + 4)
		if len(f.hold) < mark+4 {
			if f.left == 0 {
				f.err = fmt.Errorf("replication: %w: logical decoding message at %s ends inside its content length: the connection is corrupt; the session restarts", ErrProtocol, f.foreign.LSN)
			}
			return 0
		}
		f.foreign.Size = int64(binary.BigEndian.Uint32(f.hold[mark:]))
		f.hold = f.hold[:mark]
		if f.foreign.Size != f.left {
			f.err = fmt.Errorf("replication: %w: logical decoding message at %s: content claims %d bytes, %d present: the connection is corrupt; the session restarts", ErrProtocol, f.foreign.LSN, f.foreign.Size, f.left)
			return 0
		}
		f.drop()
		return 0
	case stateOwn:
		big := f.big.Load()
		n := min(int64(len(f.in)), f.left)
		big.cs.write(f.in[:n])
		f.in = f.in[n:]
		f.left -= n
		if f.left == 0 {
			f.ownDone()
		}
		return 0
	default: // stateDrop
		n := min(int64(len(f.in)), f.left)
		f.in = f.in[n:]
		f.left -= n
		if f.left == 0 {
			f.state = stateHead
		}
		return 0
	}
}

// take moves input into hold until hold has n bytes, the input is used
// up or the message ends (in states after the header).
func (f *frameFilter) take(n int64) {
	want := n - int64(len(f.hold))
	if f.state != stateHead {
		want = min(want, f.left)
	}
	k := int(min(want, int64(len(f.in))))
	f.hold = append(f.hold, f.in[:k]...)
	f.in = f.in[k:]
	if f.state != stateHead {
		f.left -= int64(k)
	}
}

// passHeld passes on what is held and the rest of its message unchanged.
func (f *frameFilter) passHeld() {
	f.out = append(f.outb[:0], f.hold...)
	f.outb, f.hold = f.out, f.hold[:0]
	f.state = statePass
	if f.left == 0 {
		f.state = stateHead
	}
}

// peek looks at the head of a CopyData held so far (after its 5-byte
// header) and decides, once it can, whether the message passes or is a
// foreign logical decoding message to drop.
func (f *frameFilter) peek() {
	for {
		body := f.hold[5:]
		need, verdict := f.classify(body, int64(len(body))+f.left)
		switch verdict {
		case peekPass:
			f.passHeld()
			return
		case peekDrop:
			f.drop()
			return
		case peekLongPrefix:
			f.state = stateDropPrefix
			return
		case peekOwn:
			f.state = stateOwn
			if f.left == 0 { // all of the content was held
				f.ownDone()
			}
			return
		}
		before := len(f.hold)
		f.take(int64(5 + need))
		if len(f.hold) == before {
			return // more input needed
		}
	}
}

type peekVerdict uint8

const (
	peekMore       peekVerdict = iota // need more of the body
	peekPass                          // not a foreign logical decoding message
	peekDrop                          // foreign, its content length read: drop it
	peekLongPrefix                    // foreign, its prefix longer than the bound
	peekOwn                           // outboxd's, too large to publish: stream it
)

// classify decides what a CopyData whose body is size bytes long and
// starts with head is; peekMore asks for need bytes of head. A body too
// short for the fields it claims passes, for the decoder to report.
func (f *frameFilter) classify(head []byte, size int64) (need int, v peekVerdict) {
	if size < msgPrefOff+1+4 {
		return 0, peekPass // too short to be one
	}
	if len(head) < 1 {
		return 1, peekMore
	}
	if head[0] != pglogrepl.XLogDataByteID {
		return 0, peekPass
	}
	if len(head) < msgPrefOff {
		return msgPrefOff, peekMore
	}
	if head[msgTypeOff] != 'M' {
		return 0, peekPass
	}
	prefix := head[msgPrefOff:]
	nul := -1
	for i, c := range prefix {
		if c == 0 {
			nul = i
			break
		}
	}
	if nul < 0 {
		bound := int64(msgPrefOff + maxForeignPrefix + 1)
		switch {
		case int64(len(head)) < min(bound, size):
			return int(min(bound, size)), peekMore
		case int64(len(head)) == size:
			return 0, peekPass // no end to the prefix
		}
		f.foreign = ForeignMessage{
			LSN:           pglogrepl.LSN(binary.BigEndian.Uint64(head[msgLSNOff:])),
			Transactional: head[msgFlagsOff]&1 != 0,
			Prefix:        string(prefix[:maxForeignPrefix]),
			PrefixCut:     true,
		}
		// Keep the cut prefix; the held byte after it is dropped with the
		// rest of the prefix.
		f.hold = f.hold[:5+msgPrefOff+maxForeignPrefix]
		return 0, peekLongPrefix
	}
	own := string(prefix[:nul]) == f.own
	big := f.big.Load()
	if own && big == nil {
		return 0, peekPass
	}
	end := msgPrefOff + nul + 1 + 4
	if len(head) < end {
		if size < int64(end) {
			return 0, peekPass
		}
		return end, peekMore
	}
	n := int64(binary.BigEndian.Uint32(head[end-4:]))
	if n != size-int64(end) {
		return 0, peekPass // content length does not match
	}
	if own {
		if n <= big.over {
			return 0, peekPass
		}
		f.ownMsg = streamedMessage{lsn: pglogrepl.LSN(binary.BigEndian.Uint64(head[msgLSNOff:])), size: n, limit: big.limit}
		// The head may hold the content's first bytes already (read while
		// looking for the prefix's end): they are the stream's first.
		big.cs.reset()
		big.cs.write(head[end:])
		f.hold = f.hold[:5+msgPrefOff+nul]
		return 0, peekOwn
	}
	f.foreign = ForeignMessage{
		LSN:           pglogrepl.LSN(binary.BigEndian.Uint64(head[msgLSNOff:])),
		Transactional: head[msgFlagsOff]&1 != 0,
		Prefix:        string(prefix[:nul]),
		Size:          n,
	}
	f.hold = f.hold[:5+msgPrefOff+nul]
	return 0, peekDrop
}

// ownDone records the check of the outboxd message streamed and passes
// the message on with empty content. The check goes first, so that the
// decoder finds it when it reads the message.
func (f *frameFilter) ownDone() {
	big := f.big.Load()
	m := f.ownMsg
	m.check = big.cs.check()
	m.check.head = bytes.Clone(m.check.head)
	big.q.push(m)
	f.emitEmpty()
	f.state = stateHead
}

// emitEmpty passes on the logical decoding message held (header, XLogData
// header, message fields up to its prefix, without the NUL) with empty
// content.
func (f *frameFilter) emitEmpty() {
	out := append(f.outb[:0], f.hold...)
	out = append(out, 0, 0, 0, 0, 0) // the prefix's NUL, content length 0
	binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-1))
	f.out, f.outb, f.hold = out, out, f.hold[:0]
}

// drop passes on the foreign message held (header, XLogData header,
// message fields up to its prefix, without the NUL) with empty content,
// and drops the f.left bytes of content that follow.
func (f *frameFilter) drop() {
	f.emitEmpty()
	f.state = stateDrop
	if f.left == 0 {
		f.state = stateHead
	}
	if f.onDrop != nil {
		f.onDrop(f.foreign)
	}
}
