package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// recordOverhead bounds a record's framing in a batch (length, attributes,
// deltas, key/value lengths, header count): varints of at most 5 bytes.
const recordOverhead = 5 * 8

// batchOverhead is a record batch's header.
const batchOverhead = 61

// batch is the records of one partition sent together: built once from
// its recBuf's queue, then sent unchanged until it is answered.
type batch struct {
	sent  time.Time // when it was first sent: its delivery timeout runs from then
	via   *sink     // the sink whose request carries it, while in flight
	bytes int       // the records' size in the batch, at most MaxMessageBytes
	recs  []*Record
	rb    *sarama.RecordBatch
}

// nextBatch counts the records of rb's queue its next new batch takes, up
// to maxBytes, and their size.
func (rb *recBuf) nextBatch(maxBytes int) (n, size int) {
	limit := maxBytes - batchOverhead
	for n < len(rb.queue) {
		s := rb.queue[n].Size() + recordOverhead
		if n > 0 && (size+s > limit || rb.single > 0) {
			break
		}
		size += s
		n++
	}
	return n, size
}

// nextBatchBytes is the size of the batch rb sends next: the one waiting to
// be sent again, or the one a new batch would take from the queue.
func (rb *recBuf) nextBatchBytes(maxBytes int) int {
	if rb.phase == partWaiting && rb.batch != nil {
		return rb.batch.bytes
	}
	_, size := rb.nextBatch(maxBytes)
	return size
}

// newBatch takes the next records of rb's queue, up to MaxMessageBytes,
// into a batch carrying the producer's id and epoch and rb's next sequence.
func (p *Producer) newBatch(rb *recBuf) *batch {
	n, size := rb.nextBatch(p.cfg.MaxMessageBytes)
	if rb.single > 0 {
		rb.single--
	}
	// The batch gets its own slice and the queue's slots are cleared: the
	// queue's array outlives the batch while records keep arriving behind
	// it, and slots still pointing at taken records kept them — values and
	// all — alive after they were acknowledged and their room released, up
	// to the array's capacity beyond the budget.
	recs := make([]*Record, n)
	copy(recs, rb.queue)
	clear(rb.queue[:n])
	rb.queue = rb.queue[n:]
	rb.queued -= size
	if len(rb.queue) == 0 {
		rb.queue, rb.urgent = nil, false
	}

	first := recs[0].Timestamp
	if first.IsZero() {
		first = p.now()
	}
	first = first.Truncate(time.Millisecond)
	b := &sarama.RecordBatch{
		Version:         2,
		ProducerID:      p.pid,
		ProducerEpoch:   p.epoch,
		FirstSequence:   rb.seq,
		FirstTimestamp:  first,
		MaxTimestamp:    first,
		LastOffsetDelta: int32(n - 1),
		IsTransactional: p.cfg.TransactionalID != "",
		Records:         make([]*sarama.Record, n),
	}
	_ = b.Codec.UnmarshalText([]byte(p.cfg.Compression))
	b.CompressionLevel = sarama.CompressionLevelDefault
	encodeRecords(b, recs)
	return &batch{bytes: size, recs: recs, rb: b}
}

// encodeRecords fills b's records from recs, relative to b's first
// timestamp, and raises its max timestamp to the latest of them.
func encodeRecords(b *sarama.RecordBatch, recs []*Record) {
	first := b.FirstTimestamp
	records := make([]sarama.Record, len(recs))
	nh := 0
	for _, r := range recs {
		nh += len(r.Headers)
	}
	headers := make([]sarama.RecordHeader, nh)
	hptrs := make([]*sarama.RecordHeader, nh)
	for i, r := range recs {
		ts := r.Timestamp
		if ts.IsZero() {
			ts = first
		}
		ts = ts.Truncate(time.Millisecond)
		if ts.After(b.MaxTimestamp) {
			b.MaxTimestamp = ts
		}
		rec := &records[i]
		rec.Key = r.Key
		rec.Value = r.Value
		rec.OffsetDelta = int64(i)
		rec.TimestampDelta = ts.Sub(first)
		if len(r.Headers) > 0 {
			hs := hptrs[:len(r.Headers):len(r.Headers)]
			hptrs = hptrs[len(r.Headers):]
			for j, h := range r.Headers {
				headers[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
				hs[j] = &headers[j]
			}
			headers = headers[len(r.Headers):]
			rec.Headers = hs
		}
		b.Records[i] = rec
	}
}

// ack hands back b's records, acknowledged in order at offsets from
// offset (-1 each when the broker gave none).
func (b *batch) ack(p *Producer, offset int64) {
	for i, r := range b.recs {
		r.Offset = -1
		if offset >= 0 {
			r.Offset = offset + int64(i)
		}
		p.emit(r)
	}
}

// settle fails b's records with cause: a batch that failed for good, or
// one that came back unacknowledged after its partition was stopped.
func (b *batch) settle(p *Producer, cause error) {
	for _, r := range b.recs {
		p.fail(r, recordErr(r, cause))
	}
}
