package replication

import "github.com/jackc/pglogrepl"

// Gate is what the stream asks, before every status update, what it may
// confirm to the server: the one place that decides a confirmed position
// (in outboxd, the publisher's watermark and delivery mode).
type Gate interface {
	// Confirmed is the end LSN of the last transaction whose events are all
	// durable downstream (the contiguous done prefix). It only moves
	// forward.
	Confirmed() pglogrepl.LSN
	// Confirmable is told the position the stream would confirm —
	// Confirmed, or past it the server's WAL end while every delivered
	// transaction is done and none is open — and returns how much of it may
	// be confirmed now (a checkpoint downstream may have to hold it first).
	Confirmable(want pglogrepl.LSN) pglogrepl.LSN
	// Done is closed when the consumer will read no more messages: it
	// drained what it had, or it gave up.
	Done() <-chan struct{}
}
