package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// nextBatch counts the records of ps's queue its next new batch takes, up
// to MaxMessageBytes, and their size.
func (p *Producer) nextBatch(ps *partitionState) (n, size int) {
	limit := p.cfg.MaxMessageBytes - batchOverhead
	for n < len(ps.queue) {
		s := ps.queue[n].Size() + recordOverhead
		if n > 0 && (size+s > limit || ps.single > 0) {
			break
		}
		size += s
		n++
	}
	return n, size
}

// nextBatchBytes is the size of the batch ps sends next: the one waiting to
// be sent again, or the one newBatch would build.
func (p *Producer) nextBatchBytes(ps *partitionState) int {
	if ps.phase == partWaiting && ps.batch != nil {
		return ps.batch.bytes
	}
	_, size := p.nextBatch(ps)
	return size
}

// newBatch takes the next records of ps's queue, up to MaxMessageBytes.
func (p *Producer) newBatch(ps *partitionState) *batch {
	n, size := p.nextBatch(ps)
	if ps.single > 0 {
		ps.single--
	}
	recs := ps.queue[:n:n]
	ps.queue = ps.queue[n:]
	ps.queued -= size
	if len(ps.queue) == 0 {
		ps.queue = nil
	}

	first := recs[0].Timestamp
	if first.IsZero() {
		first = p.now()
	}
	first = first.Truncate(time.Millisecond)
	rb := &sarama.RecordBatch{
		Version:         2,
		ProducerID:      p.pid,
		ProducerEpoch:   p.epoch,
		FirstSequence:   ps.seq,
		FirstTimestamp:  first,
		MaxTimestamp:    first,
		LastOffsetDelta: int32(n - 1),
		IsTransactional: p.cfg.TransactionalID != "",
		Records:         make([]*sarama.Record, n),
	}
	_ = rb.Codec.UnmarshalText([]byte(p.cfg.Compression))
	rb.CompressionLevel = sarama.CompressionLevelDefault
	records := make([]sarama.Record, n)
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
		if ts.After(rb.MaxTimestamp) {
			rb.MaxTimestamp = ts
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
		rb.Records[i] = rec
	}
	return &batch{bytes: size, recs: recs, rb: rb}
}
