package kafka

import "time"

// Header is one Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one event on its way to Kafka and back. A Producer returns every
// record it was given exactly once on Results, with Err set on failure.
type Record struct {
	Topic     string
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time

	OutboxID int64
	// EventID is the event id when it is not an integer (a uuid), for
	// errors and logs; empty otherwise.
	EventID string
	// Set by the producer on return.
	Partition int32
	Offset    int64
	Err       error

	// Meta is the sender's own state for the record (the publisher's
	// transaction); the producer hands it back untouched.
	Meta any

	// Urgent sends the record's partition without waiting for the linger:
	// for a record its sender waits on alone (a checkpoint read barrier, a
	// checkpoint reset), where the linger would only delay the caller.
	Urgent bool

	enqueued time.Time // when the producer queued it, for the linger
	// Done, when set, receives the record when it comes back instead of
	// Results: per-sender completion, with no shared demultiplexer. It
	// must never block (buffer it for everything the sender has out).
	Done chan<- *Record
}

// RecordOverhead bounds a record's framing in a batch: a record is refused
// as too large when Size()+RecordOverhead exceeds Config.MaxMessageBytes.
const RecordOverhead = recordOverhead

// Size is the record's key, value and header bytes.
func (r *Record) Size() int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}
