// Package e2e holds the end-to-end test of the demo's crash scenario: the
// real outboxd, order service and status consumer as processes against the
// real PostgreSQL and Kafka, each test in a database and topics of its own.
package e2e
