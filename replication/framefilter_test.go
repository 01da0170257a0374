package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
)

// beFrame is one backend message: type, length, body.
func beFrame(typ byte, body []byte) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// logicalMsg is a pgoutput Message ('M'), protocol version 1.
func logicalMsg(transactional bool, lsn uint64, prefix string, content []byte) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, lsn)
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

// copyData is a CopyData carrying XLogData with walData; its WAL end and
// send time are fixed, so that a message built again compares equal.
func copyData(walData []byte) []byte {
	b := []byte{pglogrepl.XLogDataByteID}
	b = binary.BigEndian.AppendUint64(b, 0x1000)
	b = binary.BigEndian.AppendUint64(b, 0x2000)
	b = binary.BigEndian.AppendUint64(b, 12345)
	return beFrame('d', append(b, walData...))
}

var copyBoth = beFrame('W', []byte{0, 0, 0})

// rotatedKey is testKey after a rotation: three keys to verify with.
var rotatedKey = &MessageKey{Key: testKey.Key, Next: testKey.Next, Previous: bytes.Repeat([]byte{0x3C}, 32),
	InstalledLSN: testKey.InstalledLSN, V2Until: testKey.V2Until, NextXid: testKey.NextXid}

// referenceFilter is the frame filter's contract on whole input: the
// messages of in, each transformed alone. ok is false when in ends inside
// a message or the filter must fail at one; out then holds the messages
// before it.
func referenceFilter(in []byte, own string) (out []byte, drops []ForeignMessage, ok bool, fail bool) {
	out, drops, _, ok, fail = referenceFilterOwn(in, own, -1, nil)
	return out, drops, ok, fail
}

// referenceFilterOwn is referenceFilter for a filter that streams own
// messages whose content is longer than over bytes (-1: none) with the
// keys of k: those go on with empty content, and checks holds what the
// whole-content verifier reads from each.
func referenceFilterOwn(in []byte, own string, over int64, k *MessageKey) (out []byte, drops []ForeignMessage, checks []streamedMessage, ok bool, fail bool) {
	inCopy := false
	for len(in) > 0 {
		if len(in) < 5 {
			return out, drops, checks, false, false
		}
		typ, n := in[0], int32(binary.BigEndian.Uint32(in[1:5]))
		if n < 4 {
			return out, drops, checks, false, true
		}
		if int64(len(in)) < 1+int64(n) {
			return out, drops, checks, false, false
		}
		msg, body := in[:1+n], in[5:1+n]
		in = in[1+n:]
		if !inCopy || typ != 'd' {
			switch typ {
			case 'W':
				inCopy = true
			case 'c', 'E', 'Z':
				inCopy = false
			}
			out = append(out, msg...)
			continue
		}
		if len(body) < msgPrefOff+5 || body[0] != 'w' || body[msgTypeOff] != 'M' {
			out = append(out, msg...)
			continue
		}
		lsn := pglogrepl.LSN(binary.BigEndian.Uint64(body[msgLSNOff:]))
		tx := body[msgFlagsOff]&1 != 0
		rest := body[msgPrefOff:]
		nul := bytes.IndexByte(rest, 0)
		long := nul > maxForeignPrefix || nul < 0 && len(rest) > maxForeignPrefix+1
		if !long && nul >= 0 && string(rest[:nul]) == own && over >= 0 && len(rest) >= nul+5 &&
			int(binary.BigEndian.Uint32(rest[nul+1:])) == len(rest)-nul-5 && int64(len(rest)-nul-5) > over {
			content := rest[nul+5:]
			checks = append(checks, streamedMessage{lsn: lsn, size: int64(len(content)), check: wholeCheck(content, k)})
			out = append(out, beFrame('d', logicalHead(body, rest[:nul]))...)
			continue
		}
		if !long {
			if nul < 0 || string(rest[:nul]) == own || len(rest) < nul+5 ||
				int(binary.BigEndian.Uint32(rest[nul+1:])) != len(rest)-nul-5 {
				out = append(out, msg...)
				continue
			}
			drops = append(drops, ForeignMessage{LSN: lsn, Transactional: tx, Prefix: string(rest[:nul]), Size: int64(len(rest) - nul - 5)})
			out = append(out, beFrame('d', logicalHead(body, rest[:nul]))...)
			continue
		}
		if nul < 0 || len(rest) < nul+5 || int(binary.BigEndian.Uint32(rest[nul+1:])) != len(rest)-nul-5 {
			return out, drops, checks, false, true
		}
		cut := rest[:maxForeignPrefix]
		drops = append(drops, ForeignMessage{LSN: lsn, Transactional: tx, Prefix: string(cut), PrefixCut: true, Size: int64(len(rest) - nul - 5)})
		out = append(out, beFrame('d', logicalHead(body, cut))...)
	}
	return out, drops, checks, true, false
}

// wholeCheck is what verify reads from the whole content c under the keys
// of k, its head cut to what a contentStream holds.
func wholeCheck(c []byte, k *MessageKey) contentCheck {
	chk := newMessageVerifier(k).check(c)
	chk.head = bytes.Clone(chk.head[:min(len(chk.head), contentHeadMax)])
	return chk
}

// firstDiff says where got and want, too long to print, differ.
func firstDiff(got, want []byte) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	from := max(0, i-40)
	return fmt.Sprintf("%d bytes, want %d; from byte %d: got %q, want %q", len(got), len(want), from,
		got[from:min(len(got), i+40)], want[from:min(len(want), i+40)])
}

// sameCheck compares two contentChecks by value.
func sameCheck(a, b contentCheck) bool {
	return a.format == b.format && a.signed == b.signed && a.macOK == b.macOK &&
		a.xidEnd == b.xidEnd && a.fields == b.fields && bytes.Equal(a.head, b.head)
}

// logicalHead is a message's body up to its prefix, then prefix, with
// empty content.
func logicalHead(body, prefix []byte) []byte {
	b := append(bytes.Clone(body[:msgPrefOff]), prefix...)
	return append(b, 0, 0, 0, 0, 0)
}

// chunked returns in in chunks of the sizes given (cycled, 0 taken as 1),
// then io.EOF; with timeouts set it returns a timeout error before every
// other chunk, as a read deadline would.
type chunked struct {
	in       []byte
	sizes    []int
	i        int
	timeouts bool
	timedOut bool
	issued   int // timeouts returned
}

var errTimeout = errors.New("i/o timeout (test)")

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	if c.timeouts && !c.timedOut && c.i%2 == 1 {
		c.timedOut = true
		c.issued++
		return 0, errTimeout
	}
	c.timedOut = false
	n := 1 << 20
	if len(c.sizes) > 0 {
		n = max(1, c.sizes[c.i%len(c.sizes)])
	}
	c.i++
	n = copy(p[:min(len(p), n)], c.in)
	c.in = c.in[n:]
	return n, nil
}

// drain reads f to its end with reads of the sizes given (cycled),
// going on after errTimeout; it returns the output and the final error.
func drain(t testing.TB, f *frameFilter, sizes []int) ([]byte, error) {
	var out []byte
	timeouts := 0
	src, _ := f.r.(*chunked)
	buf := make([]byte, 1<<16)
	for i := 0; ; i++ {
		n := len(buf)
		if len(sizes) > 0 {
			n = min(n, max(1, sizes[i%len(sizes)]))
		}
		p := buf[:n]
		k, err := f.Read(p)
		out = append(out, p[:k]...)
		if errors.Is(err, errTimeout) {
			// One per timed-out read of the source, never more: a
			// deadline's timeout must not stick.
			if timeouts++; src == nil || timeouts > src.issued {
				t.Fatalf("errTimeout %d times, the source gave it %d times", timeouts, src.issued)
			}
			continue
		}
		if err != nil {
			return out, err
		}
		if k == 0 {
			t.Fatalf("Read returned 0, nil")
		}
	}
}

// runFilter filters in read in chunks of readSizes with reads of pSizes.
func runFilter(t testing.TB, in []byte, readSizes, pSizes []int, timeouts bool) ([]byte, []ForeignMessage, error) {
	var drops []ForeignMessage
	f := newFrameFilter(&chunked{in: in, sizes: readSizes, timeouts: timeouts}, MessagePrefix, func(m ForeignMessage) { drops = append(drops, m) })
	out, err := drain(t, f, pSizes)
	return out, drops, err
}

// checkAgainstReference runs the filter on in and compares it with
// referenceFilter.
func checkAgainstReference(t testing.TB, in []byte, readSizes, pSizes []int, timeouts bool) {
	t.Helper()
	want, wantDrops, ok, fail := referenceFilter(in, MessagePrefix)
	got, drops, err := runFilter(t, in, readSizes, pSizes, timeouts)
	switch {
	case ok:
		if err != io.EOF {
			t.Fatalf("whole input: error %v, want io.EOF", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("output differs from the reference:\n got %q\nwant %q\n  in %q", got, want, in)
		}
	case fail:
		if err == nil || err == io.EOF || !errors.Is(err, ErrProtocol) {
			t.Fatalf("input the filter must refuse: error %v, want ErrProtocol", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("output before the bad message differs:\n got %q\nwant %q", got, want)
		}
	default: // cut short: what the filter gave is the whole messages, then part of the next
		if !bytes.HasPrefix(got, want) {
			t.Fatalf("input cut short: output does not start with the reference's whole messages:\n got %q\nwant %q", got, want)
		}
		if len(got) > len(in) {
			t.Fatalf("output %d bytes, longer than the input's %d", len(got), len(in))
		}
		return
	}
	if len(drops) != len(wantDrops) {
		t.Fatalf("dropped %+v, want %+v", drops, wantDrops)
	}
	for i := range drops {
		if drops[i] != wantDrops[i] {
			t.Fatalf("drop %d: %+v, want %+v", i, drops[i], wantDrops[i])
		}
	}
}

// runFilterOwn is runFilter with own messages longer than over streamed
// under the keys of k; it returns the checks the filter recorded.
func runFilterOwn(t testing.TB, in []byte, readSizes, pSizes []int, timeouts bool, over int64, k *MessageKey) ([]byte, []ForeignMessage, []streamedMessage, error) {
	var drops []ForeignMessage
	f := newFrameFilter(&chunked{in: in, sizes: readSizes, timeouts: timeouts}, MessagePrefix, func(m ForeignMessage) { drops = append(drops, m) })
	q := &streamedMessages{}
	f.streamOwn(k, 1, q)
	f.big.Load().over = over
	out, err := drain(t, f, pSizes)
	return out, drops, q.q, err
}

// checkAgainstReferenceOwn is checkAgainstReference for a filter that
// streams own messages longer than over bytes: the same output, and for
// each streamed message the check the whole-content verifier reads.
func checkAgainstReferenceOwn(t testing.TB, in []byte, readSizes, pSizes []int, timeouts bool, over int64, k *MessageKey) {
	t.Helper()
	want, wantDrops, wantChecks, ok, fail := referenceFilterOwn(in, MessagePrefix, over, k)
	got, drops, checks, err := runFilterOwn(t, in, readSizes, pSizes, timeouts, over, k)
	switch {
	case ok:
		if err != io.EOF {
			t.Fatalf("whole input: error %v, want io.EOF", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("output differs from the reference: %s", firstDiff(got, want))
		}
	case fail:
		if err == nil || err == io.EOF || !errors.Is(err, ErrProtocol) {
			t.Fatalf("input the filter must refuse: error %v, want ErrProtocol", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("output before the bad message differs: %s", firstDiff(got, want))
		}
	default:
		if !bytes.HasPrefix(got, want) {
			t.Fatalf("input cut short: output does not start with the reference's whole messages:\n got %q\nwant %q", got, want)
		}
		return
	}
	if len(drops) != len(wantDrops) {
		t.Fatalf("dropped %+v, want %+v", drops, wantDrops)
	}
	if len(checks) != len(wantChecks) {
		t.Fatalf("streamed %d own messages, want %d", len(checks), len(wantChecks))
	}
	for i, c := range checks {
		w := wantChecks[i]
		if c.lsn != w.lsn || c.size != w.size || !sameCheck(c.check, w.check) {
			t.Fatalf("streamed message %d: %+v\nthe whole-content verifier reads %+v", i, c, w)
		}
	}
}

// TestFrameFilterDropsForeignContent: in the replication stream a
// message with another prefix reaches pgproto3 with its header and empty
// content, whatever its size; the drop names its LSN, prefix and size.
func TestFrameFilterDropsForeignContent(t *testing.T) {
	content := bytes.Repeat([]byte("x"), 3<<20)
	in := append(bytes.Clone(copyBoth), copyData(logicalMsg(true, 0xAB, "stranger", content))...)
	got, drops, err := runFilter(t, in, []int{4096}, nil, false)
	if err != io.EOF {
		t.Fatal(err)
	}
	want := append(bytes.Clone(copyBoth), copyData(logicalMsg(true, 0xAB, "stranger", nil))...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if len(drops) != 1 || drops[0] != (ForeignMessage{LSN: 0xAB, Transactional: true, Prefix: "stranger", Size: int64(len(content))}) {
		t.Fatalf("drops %+v", drops)
	}
	// What pgproto3 then reads is a CopyData the decoder takes as a
	// message of that prefix without content, as before.
	fe := pgproto3.NewFrontend(bytes.NewReader(got), io.Discard)
	if m, err := fe.Receive(); err != nil {
		t.Fatal(err)
	} else if _, ok := m.(*pgproto3.CopyBothResponse); !ok {
		t.Fatalf("first message %T %v", m, err)
	}
	m, err := fe.Receive()
	if err != nil {
		t.Fatal(err)
	}
	xld, err := pglogrepl.ParseXLogData(m.(*pgproto3.CopyData).Data[1:])
	if err != nil {
		t.Fatal(err)
	}
	var lm logicalMessage
	if err := lm.decode(xld.WALData); err != nil || string(lm.prefix) != "stranger" || len(lm.content) != 0 || lm.lsn != 0xAB {
		t.Fatalf("decoded %+v, %v", lm, err)
	}
}

// TestFrameFilterPassesOwnPrefix: outboxd's own messages, large or not,
// and everything that is not a logical decoding message pass byte for byte.
func TestFrameFilterPassesOwnPrefix(t *testing.T) {
	in := bytes.Clone(copyBoth)
	in = append(in, copyData(logicalMsg(true, 1, MessagePrefix, bytes.Repeat([]byte("v3:"), 100_000)))...)
	in = append(in, copyData(logicalMsg(true, 1, MessagePrefix, bytes.Repeat([]byte{0}, 400)))...)
	in = append(in, copyData(logicalMsg(false, 2, MessagePrefix, nil))...)
	in = append(in, copyData([]byte("B0123456789abcdefghij"))...)
	in = append(in, beFrame('d', []byte{'k', 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0})...)
	in = append(in, beFrame('N', []byte("Snotice\x00\x00"))...)
	kept := len(in)
	// Prefixes that start like outboxd's, or that outboxd's starts with,
	// are not outboxd's.
	in = append(in, copyData(logicalMsg(true, 3, MessagePrefix+"x", []byte("dropped")))...)
	in = append(in, copyData(logicalMsg(true, 4, MessagePrefix[:3], []byte("dropped")))...)
	got, drops, err := runFilter(t, in, []int{7, 1, 300}, []int{5, 1000}, true)
	if err != io.EOF {
		t.Fatal(err)
	}
	want, _, _, _ := referenceFilter(in, MessagePrefix)
	if !bytes.Equal(got, want) {
		t.Fatalf("output differs")
	}
	if !bytes.HasPrefix(got, in[:kept]) {
		t.Fatalf("own messages and other frames changed")
	}
	if len(drops) != 2 || drops[0].Prefix != MessagePrefix+"x" || drops[1].Prefix != MessagePrefix[:3] {
		t.Fatalf("drops %+v, want the two look-alike prefixes", drops)
	}
}

// TestFrameFilterOnlyInCopyBoth: before START_REPLICATION's
// CopyBothResponse and after the copy ends, a CopyData shaped like a
// foreign message passes unchanged: it is not the replication stream.
func TestFrameFilterOnlyInCopyBoth(t *testing.T) {
	foreign := copyData(logicalMsg(true, 1, "stranger", []byte("content")))
	for _, end := range []byte{'c', 'E', 'Z'} {
		in := bytes.Clone(foreign)
		in = append(in, copyBoth...)
		in = append(in, foreign...)
		in = append(in, beFrame(end, nil)...)
		in = append(in, foreign...)
		got, drops, err := runFilter(t, in, []int{3}, nil, false)
		if err != io.EOF {
			t.Fatal(err)
		}
		want := bytes.Clone(foreign)
		want = append(want, copyBoth...)
		want = append(want, copyData(logicalMsg(true, 1, "stranger", nil))...)
		want = append(want, beFrame(end, nil)...)
		want = append(want, foreign...)
		if !bytes.Equal(got, want) || len(drops) != 1 {
			t.Fatalf("after %q: got %q (drops %+v), want %q", end, got, drops, want)
		}
	}
}

// TestFrameFilterLongPrefix: a prefix longer than the filter holds is
// cut in the message passed on and dropped as it streams with the
// content.
func TestFrameFilterLongPrefix(t *testing.T) {
	prefix := strings.Repeat("p", 100_000)
	in := append(bytes.Clone(copyBoth), copyData(logicalMsg(false, 9, prefix, []byte("content")))...)
	got, drops, err := runFilter(t, in, []int{1000}, nil, false)
	if err != io.EOF {
		t.Fatal(err)
	}
	want := append(bytes.Clone(copyBoth), copyData(logicalMsg(false, 9, prefix[:maxForeignPrefix], nil))...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes %q…, want %d", len(got), got[:min(len(got), 80)], len(want))
	}
	if len(drops) != 1 || drops[0] != (ForeignMessage{LSN: 9, Prefix: prefix[:maxForeignPrefix], PrefixCut: true, Size: 7}) {
		t.Fatalf("drops %+v", drops)
	}
	for _, n := range []int{maxForeignPrefix - 1, maxForeignPrefix, maxForeignPrefix + 1, maxForeignPrefix + 2} {
		in := append(bytes.Clone(copyBoth), copyData(logicalMsg(false, 9, prefix[:n], []byte("c")))...)
		checkAgainstReference(t, in, []int{1}, []int{1}, false)
		checkAgainstReference(t, in, nil, nil, false)
	}
}

// TestFrameFilterMalformed: a message the filter cannot read is either
// passed on unchanged, for the decoder to report, while nothing of it was
// dropped, or an error once something was; never a panic or a wait.
func TestFrameFilterMalformed(t *testing.T) {
	ok := logicalMsg(true, 1, "stranger", []byte("content"))
	longPrefix := logicalMsg(true, 1, strings.Repeat("p", 400), []byte("content"))
	cases := map[string]struct {
		in      []byte
		wantErr bool
	}{
		"negative length":          {beFrame('d', nil)[:1:1], false},
		"content length too large": {copyData(append(bytes.Clone(ok[:len(ok)-7-4]), 0, 0, 0, 99, 'x')), false},
		"content length too small": {copyData(append(bytes.Clone(ok[:len(ok)-7-4]), 0, 0, 0, 0, 'x')), false},
		"no NUL in a short prefix": {copyData([]byte("M\x01\x00\x00\x00\x00\x00\x00\x00\x01strangerstranger")), false},
		"short body":               {beFrame('d', []byte("w123")), false},
		"empty CopyData":           {beFrame('d', nil), false},
		"long prefix, no NUL":      {copyData(bytes.Repeat([]byte("M"), 600)), true},
		"long prefix, bad length":  {copyData(append(bytes.Clone(longPrefix), 'x')), true},
		"long prefix, cut length":  {copyData(longPrefix[:len(longPrefix)-7-2]), true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			in := append(bytes.Clone(copyBoth), c.in...)
			if name == "negative length" {
				in = append(in, 0xff, 0xff, 0xff, 0xf0)
			}
			in = append(in, copyData(ok)...)
			_, _, _, fail := referenceFilter(in, MessagePrefix)
			if fail != (c.wantErr || name == "negative length") {
				t.Fatalf("reference: fail %v", fail)
			}
			for _, sizes := range [][]int{nil, {1}, {2, 3}} {
				checkAgainstReference(t, in, sizes, sizes, false)
			}
		})
	}
	// Cut short anywhere: EOF (or an error), never a hang.
	in := append(bytes.Clone(copyBoth), copyData(longPrefix)...)
	in = append(in, copyData(ok)...)
	for i := range in {
		checkAgainstReference(t, in[:i], []int{3}, []int{2}, false)
	}
}

// genStream builds a byte stream of backend messages from r: messages
// before and after copy-both, keepalives, other pgoutput messages,
// outboxd's and foreign logical decoding messages of any size and prefix
// length, and now and then a malformed one.
func genStream(r *rand.Rand) []byte {
	var in []byte
	prefix := func() string {
		switch r.IntN(6) {
		case 0:
			return MessagePrefix
		case 1:
			return ""
		case 2:
			return strings.Repeat("p", maxForeignPrefix-2+r.IntN(5))
		case 3:
			return strings.Repeat("q", r.IntN(2000))
		default:
			return fmt.Sprintf("tool%d", r.IntN(100))
		}
	}
	content := func() []byte {
		n := r.IntN(40)
		if r.IntN(8) == 0 {
			n = r.IntN(100_000)
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.IntN(3)) // NULs among them
		}
		switch r.IntN(6) {
		case 0: // what outbox_emit writes, under any of the keys
			return signedV3([][]byte{rotatedKey.Key, rotatedKey.Next, rotatedKey.Previous, {9}}[r.IntN(4)], uint64(r.IntN(3)), fieldsOf("t", "k", "{}", string(b)))
		case 1:
			return signed(rotatedKey.Key, fieldsOf("t", "k", "{}", string(b)))
		case 2: // cut inside the MAC or xid
			c := signedV3(rotatedKey.Key, 1, fieldsOf("t", "k", "{}", string(b)))
			return c[:r.IntN(len(c)+1)]
		}
		return b
	}
	msg := func() []byte {
		switch r.IntN(10) {
		case 0:
			return beFrame('d', []byte{'k', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0})
		case 1:
			return beFrame('N', []byte("Mnotice\x00\x00"))
		case 2:
			return copyData([]byte("C\x00"))
		case 3:
			b := logicalMsg(r.IntN(2) == 0, r.Uint64(), prefix(), content())
			return copyData(b[:r.IntN(len(b)+1)]) // malformed: cut
		default:
			return copyData(logicalMsg(r.IntN(2) == 0, r.Uint64(), prefix(), content()))
		}
	}
	for range r.IntN(4) {
		in = append(in, msg()...) // before START_REPLICATION
	}
	in = append(in, copyBoth...)
	for range r.IntN(30) {
		in = append(in, msg()...)
	}
	if r.IntN(4) == 0 {
		in = append(in, beFrame('c', nil)...)
		in = append(in, msg()...)
	}
	return in
}

func genSizes(r *rand.Rand) []int {
	s := make([]int, 1+r.IntN(8))
	for i := range s {
		switch r.IntN(3) {
		case 0:
			s[i] = 1 + r.IntN(8)
		case 1:
			s[i] = 1 + r.IntN(400)
		default:
			s[i] = 1 + r.IntN(70_000)
		}
	}
	return s
}

// TestFrameFilterMatchesReference: generated streams split at random
// points, read with reads of random sizes and timeouts between chunks,
// give exactly what the reference gives on the whole messages.
func TestFrameFilterMatchesReference(t *testing.T) {
	n := 150
	if testing.Short() {
		n = 50
	}
	seed := uint64(os.Getpid())
	if s := os.Getenv("OUTBOXD_FRAMEFILTER_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	t.Logf("seed %d (OUTBOXD_FRAMEFILTER_SEED=%[1]d replays it)", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range n {
		in := genStream(r)
		readSizes, pSizes := genSizes(r), genSizes(r)
		timeouts := r.IntN(2) == 0
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkAgainstReference(t, in, readSizes, pSizes, timeouts)
			over := int64(r.IntN(200))
			checkAgainstReferenceOwn(t, in, readSizes, pSizes, timeouts, over, rotatedKey)
			if cut := r.IntN(len(in) + 1); cut < len(in) {
				checkAgainstReference(t, in[:cut], readSizes, pSizes, timeouts)
				checkAgainstReferenceOwn(t, in[:cut], readSizes, pSizes, timeouts, over, rotatedKey)
			}
		})
	}
}

// FuzzFrameFilter: any input, split anywhere, is filtered as the
// reference filters its whole messages, and never panics or hangs.
func FuzzFrameFilter(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		if in := genStream(r); len(in) <= 4<<10 {
			f.Add(in, []byte{1, 7, 200})
		}
	}
	f.Add(append(bytes.Clone(copyBoth), copyData(logicalMsg(true, 1, "x", []byte("yz")))...), []byte{1})
	f.Add(append(bytes.Clone(copyBoth), copyData(logicalMsg(true, 1, MessagePrefix, signedV3(rotatedKey.Previous, 1, fieldsOf("t", "k", "{}", "{}"))))...), []byte{1, 9})
	f.Fuzz(func(t *testing.T, in []byte, splits []byte) {
		sizes := make([]int, len(splits))
		for i, b := range splits {
			sizes[i] = int(b)
		}
		// Streams that start in copy-both, so that fuzzed bytes reach the
		// interesting states.
		checkAgainstReference(t, append(bytes.Clone(copyBoth), in...), sizes, sizes, len(splits)%2 == 1)
		checkAgainstReference(t, in, sizes, nil, false)
		// Own messages longer than a few bytes streamed through their MAC
		// check: the check is the whole-content verifier's.
		checkAgainstReferenceOwn(t, append(bytes.Clone(copyBoth), in...), sizes, sizes, len(splits)%2 == 1, int64(len(splits)%64), rotatedKey)
	})
}

// BenchmarkFrameFilter reads a replication stream of 200-byte Insert
// messages through pgproto3, with and without the filter: the filter's
// cost on the common path.
func BenchmarkFrameFilter(b *testing.B) {
	var in []byte
	in = append(in, copyBoth...)
	row := append([]byte{'I', 0, 0, 0, 1, 'N', 0, 1, 't', 0, 0, 0, 180}, bytes.Repeat([]byte("x"), 180)...)
	for len(in) < 8<<20 {
		in = append(in, copyData(row)...)
	}
	for _, filtered := range []bool{false, true} {
		b.Run(fmt.Sprintf("filtered=%v", filtered), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for range b.N {
				var r io.Reader = bytes.NewReader(in)
				if filtered {
					r = newFrameFilter(r, MessagePrefix, nil)
				}
				fe := pgproto3.NewFrontend(r, io.Discard)
				for {
					if _, err := fe.Receive(); err != nil {
						break
					}
				}
			}
		})
	}
}
