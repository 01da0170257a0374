// Package replication gets committed outbox rows out of PostgreSQL through
// logical replication with the pgoutput plugin.
//
// It has two parts:
//
//   - The Decoder, which is pure: it turns one pgoutput message (the WALData
//     of an XLogData message; protocol version 1, text format, no streaming)
//     into a Message — the Begin of a transaction, an Event for each row
//     inserted into the outbox table, the Commit — and keeps the relation
//     cache and the transaction state it needs to do so. It does no I/O, and
//     for an Insert it allocates the Event's own fields and nothing else.
//   - The stream, which owns the replication connection: it starts
//     replication from a slot, feeds the messages it receives to a Decoder,
//     and confirms positions back to the server. Between the socket (after
//     TLS) and pgconn a frame filter drops the content of logical decoding
//     messages with another prefix than outboxd's as it arrives, so that
//     no such message, of whatever size, is ever held in memory.
//
// The position to confirm to the server is a transaction's Commit.EndLSN,
// and only once every Event of that transaction is durable downstream.
// Confirming earlier loses the transaction if the process dies; confirming
// the CommitLSN instead makes the server send the transaction again after
// every restart; row positions are not monotonic across transactions.
//
// Errors returned by the Decoder wrap one of ErrProtocol, ErrUnknownRelation,
// ErrMissingColumn or ErrBadValue; see DecodeError and MissingColumnError.
package replication
