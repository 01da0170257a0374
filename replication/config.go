package replication

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// StreamConfig says where to stream from and how long to wait for the server.
// Start from DefaultStreamConfig.
type StreamConfig struct {
	// ConnString is a libpq DSN or URL; the stream adds replication=database.
	ConnString string
	// Slot is the logical replication slot (plugin pgoutput) to stream from.
	Slot string
	// Publication is the publication pgoutput filters changes through.
	// Both names are sent quoted, so they are taken exactly as written
	// (case included).
	Publication string
	// StatusInterval bounds the time between two standby status updates.
	// It must stay well below the server's wal_sender_timeout (60 s default).
	StatusInterval time.Duration
	// ServerTimeout is how long the stream waits for any message from the
	// server (data or keepalive) before Run gives up with ErrServerSilent.
	// After half of it in silence the stream asks the server for a
	// keepalive, which a live walsender answers at once. Only time spent
	// waiting for the server counts: time blocked on a full out channel
	// (backpressure) does not.
	ServerTimeout time.Duration
	// ConnectTimeout bounds connecting when ConnString sets no
	// connect_timeout, and then, separately, checking the slot and starting
	// replication.
	ConnectTimeout time.Duration
	Decoder        DecoderConfig
	// OnConfirm, when set, is called with the slot's position once Open
	// started streaming, and then on Run's goroutine after each standby
	// status update with the flush position it confirmed to the server:
	// what the slot's confirmed_flush_lsn becomes. It must not block.
	OnConfirm func(flush pglogrepl.LSN)
	// OnForeignMessage, when set, is called for each logical decoding
	// message with another prefix than outboxd's, whose content the stream
	// drops unread as it arrives (see frameFilter): for a metric. It runs
	// on the goroutine reading the connection and must not block.
	OnForeignMessage func(ForeignMessage)
	// MaxMessageBytes is the largest record the producer accepts
	// (--kafka-max-message-bytes); 0: no bound. An outbox_emit message
	// whose content is larger (by more than its framing, ownSlack) cannot
	// be published, so the stream does not hold it: its content is read
	// through the MAC check as it arrives, and an authentic one becomes a
	// bad event (see frameFilter). Anyone who can emit a message with
	// outboxd's prefix (PUBLIC, by default) could otherwise make outboxd
	// hold up to 1 GB.
	MaxMessageBytes int
}

// DefaultStreamConfig returns the defaults: slot and publication "outboxd",
// a status update every 10 s, a 60 s server timeout, a 10 s connect timeout,
// and the standard outbox table.
//
// ServerTimeout is 60 s, PostgreSQL's own wal_receiver_timeout default, with
// the same ping at half of it that PostgreSQL's walreceiver and apply worker
// use. A live walsender answers a ping at once when it is waiting for WAL,
// but only within wal_sender_timeout/2 (30 s by default) when it is busy
// decoding a large transaction that sends nothing: a timeout of 30 s or less
// would then restart the session, which decodes the same transaction again.
// 60 s stays at half of 2 × wal_sender_timeout, so a half-open connection
// is noticed about when the server itself drops it.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{
		Slot:           "outboxd",
		Publication:    "outboxd",
		StatusInterval: 10 * time.Second,
		ServerTimeout:  60 * time.Second,
		ConnectTimeout: 10 * time.Second,
		Decoder:        DecoderConfig{Columns: DefaultColumns()},
	}
}

// maxNameLen is NAMEDATALEN-1 of a stock PostgreSQL build: the server
// truncates longer names, so a lookup would match another slot.
const maxNameLen = 63

// Validate reports every invalid field at once, one line each. It checks the
// configuration as given: Open fills zero durations from DefaultStreamConfig
// first, Validate does not.
func (c StreamConfig) Validate() error {
	var errs []error
	for _, f := range []struct{ field, value string }{
		{"slot", c.Slot},
		{"publication", c.Publication},
	} {
		switch {
		case f.value == "":
			errs = append(errs, fmt.Errorf("replication: %s name is empty: set it (default %q)", f.field, "outboxd"))
		case len(f.value) > maxNameLen:
			errs = append(errs, fmt.Errorf("replication: %s name is %d bytes long, PostgreSQL allows at most %d: choose a shorter name", f.field, len(f.value), maxNameLen))
		case strings.IndexByte(f.value, 0) >= 0:
			errs = append(errs, fmt.Errorf("replication: %s name %q contains a NUL byte: remove it", f.field, f.value))
		}
	}
	for _, f := range []struct {
		field string
		value time.Duration
	}{
		{"status interval", c.StatusInterval},
		{"server timeout", c.ServerTimeout},
		{"connect timeout", c.ConnectTimeout},
	} {
		if f.value <= 0 {
			errs = append(errs, fmt.Errorf("replication: %s must be > 0, got %s: set a positive duration", f.field, f.value))
		}
	}
	return errors.Join(errs...)
}

// withDefaults fills zero durations from DefaultStreamConfig, so that a
// literal naming only the connection, slot and publication works.
func (c StreamConfig) withDefaults() StreamConfig {
	d := DefaultStreamConfig()
	if c.StatusInterval == 0 {
		c.StatusInterval = d.StatusInterval
	}
	if c.ServerTimeout == 0 {
		c.ServerTimeout = d.ServerTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	return c
}
