package slot

import (
	"fmt"
	"regexp"
)

// Config names the PostgreSQL objects outboxd uses. All names are plain,
// unquoted identifiers (lower case), so they read the same in SQL, in
// PostgreSQL's catalogs and in error messages.
type Config struct {
	// Slot is the persistent logical replication slot (plugin pgoutput).
	// Slot names are cluster-wide: two outboxd deployments on one cluster
	// need different ones. PostgreSQL allows only [a-z0-9_] in slot names.
	Slot string
	// Publication is the publication pgoutput filters changes through. It
	// belongs to the database outboxd connects to.
	Publication string
	// Schema and Table name the outbox table.
	Schema string
	Table  string
	// Failover makes a slot that Ensure creates on PostgreSQL 17 or later a
	// failover slot (pg_create_logical_replication_slot's failover argument):
	// a standby with sync_replication_slots = on keeps a copy of it, so that
	// streaming resumes on the standby after a promotion. Ignored before 17,
	// where slots live only on the primary, and for a slot that exists.
	Failover bool
	// Tableless is the table-less outbox: events are logical decoding
	// messages written by outbox_emit, there is no outbox table to check,
	// and the publication Ensure creates has no table (pgoutput needs one
	// by name; messages pass no publication filter). Needs PostgreSQL 14
	// or later.
	Tableless bool
	// Columns are the columns outboxd reads from the outbox table, as the
	// decoder is configured (replication.DecoderConfig.TableColumns). Nil:
	// outboxd's own table (id, aggregate_id, payload, and topic unless a
	// default topic is set).
	Columns []Column
}

// Column is one column outboxd reads from the outbox table.
type Column struct {
	// Name is the column's name.
	Name string
	// Role says what outboxd reads it for ("id", "key", ...), for messages.
	Role string
	// Required columns must exist; the others are read when they do.
	Required bool
	// Types are the type names (as format_type writes them: "bigint",
	// "timestamp with time zone") it may have; empty: any.
	Types []string
}

// DefaultConfig returns the configuration outboxd uses unless told otherwise:
// slot and publication "outboxd", table public.outbox, a failover slot on
// PostgreSQL 17 or later.
func DefaultConfig() Config {
	return Config{
		Slot:        "outboxd",
		Publication: "outboxd",
		Schema:      "public",
		Table:       "outbox",
		Failover:    true,
	}
}

// maxIdentifierLen is NAMEDATALEN-1 of a stock PostgreSQL build: longer names
// are truncated by the server, which would make the catalog lookups miss.
const maxIdentifierLen = 63

var (
	plainIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)
	slotName        = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// Validate reports the first field that is empty or not a valid unquoted
// PostgreSQL identifier: [a-z_][a-z0-9_$]*, at most 63 bytes ('$' is not
// allowed in Slot, which PostgreSQL limits to [a-z0-9_]). The error wraps
// ErrInvalidConfig.
func (c Config) Validate() error {
	d := DefaultConfig()
	for _, f := range []struct {
		field, value, def string
		re                *regexp.Regexp
		want              string
	}{
		{"Slot", c.Slot, d.Slot, slotName, "[a-z_][a-z0-9_]*"},
		{"Publication", c.Publication, d.Publication, plainIdentifier, "[a-z_][a-z0-9_$]*"},
		{"Schema", c.Schema, d.Schema, plainIdentifier, "[a-z_][a-z0-9_$]*"},
		{"Table", c.Table, d.Table, plainIdentifier, "[a-z_][a-z0-9_$]*"},
	} {
		switch {
		case f.value == "":
			return newError(ErrInvalidConfig, fmt.Sprintf("invalid slot configuration: %s is empty: set it, or start from DefaultConfig() (%s %q)", f.field, f.field, f.def))
		case len(f.value) > maxIdentifierLen:
			return newError(ErrInvalidConfig, fmt.Sprintf("invalid slot configuration: %s %q is %d bytes long, PostgreSQL allows at most %d: choose a shorter name", f.field, f.value, len(f.value), maxIdentifierLen))
		case !f.re.MatchString(f.value):
			return newError(ErrInvalidConfig, fmt.Sprintf("invalid slot configuration: %s %q is not a plain PostgreSQL identifier: use lower-case letters, digits and underscores (%s)", f.field, f.value, f.want))
		}
	}
	return nil
}

// qualifiedTable is schema.table as messages show it.
func (c Config) qualifiedTable() string { return c.Schema + "." + c.Table }
