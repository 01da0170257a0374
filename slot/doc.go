// Package slot manages the PostgreSQL side of outboxd: the publication and the
// persistent pgoutput logical replication slot that outboxd streams from, the
// preflight checks that tell an operator what to fix before streaming can
// work, and the slot's status for monitoring.
//
// # Life cycle
//
// [Ensure] creates what is missing, publication first and then the slot:
// pgoutput looks up the publication in the catalog as of the position being
// decoded, so a slot that is older than its publication fails with
// "publication ... does not exist" on every change written before the
// publication was. For the same reason Ensure refuses to create a publication
// for a slot that already exists (see [ErrPublicationMissing]). [Drop] removes
// the slot (and optionally the publication) and refuses while a client
// streams from the slot. Dropping the slot discards its position: outbox rows
// written until it is created again are not published.
//
// # Errors
//
// Every problem this package diagnoses is returned as an [*Error] whose text
// is one line saying what is wrong and how to fix it, and which wraps one of
// the sentinel errors (ErrWALLevel, ErrSlotMissing, ...) for callers to test
// with [errors.Is]. Failures of the database itself (a lost connection, a
// permission the package does not check for) are returned wrapped with %w and
// keep their *pgconn.PgError.
//
// # Connections
//
// All functions take an ordinary (not replication) connection to the database
// that holds the outbox table, and use it without a transaction of their own
// around calls; the connection must not be inside a transaction, because
// pg_create_logical_replication_slot refuses to run in one that has written.
// Replication slots are cluster-wide; publications belong to one database.
package slot
