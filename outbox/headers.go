package outbox

import "strings"

// The header names outboxd itself sets on a record, in any configuration:
// its own shape's (HeaderOutboxID, HeaderAggregateID, HeaderEventType,
// HeaderOrigin), the CloudEvents binding's (content-type and every ce_*
// attribute) and the dead-letter vocabulary's (every dlq-* header, and the
// outboxd-* names written before it). A writer who could set one of them
// would put a second value beside outboxd's, and a reader taking the first
// or the last would trust whichever came there: deduplicate on a forged
// origin, or read a forged id. So an event whose own headers (the headers
// column, an outbox_emit headers object) name one is a bad event, and
// outbox_emit refuses it at the writer (migrations/008_outbox_emit_headers.sql
// holds the same list: change both together).
var (
	reservedHeaders        = []string{HeaderOutboxID, HeaderAggregateID, HeaderEventType, HeaderOrigin, "content-type"}
	reservedHeaderPrefixes = []string{"ce_", "dlq-", "outboxd-"}
)

// ReservedHeader reports whether name is one of the header names outboxd
// sets itself in any configuration (matched exactly, as Kafka and package
// consumer compare header names).
func ReservedHeader(name string) bool {
	for _, r := range reservedHeaders {
		if name == r {
			return true
		}
	}
	for _, p := range reservedHeaderPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// OwnHeaders returns the header names m sets on every record beyond
// ReservedHeader's: its id and key headers when they are renamed (Debezium's
// "id"), for the decoder to reserve as well
// (replication.DecoderConfig.ReservedHeaders).
func (m *Mapping) OwnHeaders() []string {
	var out []string
	for _, h := range []string{or(m.IDHeader, HeaderOutboxID), or(m.KeyHeader, HeaderAggregateID)} {
		if h != noHeader && !ReservedHeader(h) {
			out = append(out, h)
		}
	}
	return out
}

// ReservedIn returns the first of an event's own headers hs that names one
// of the headers m's records carry as outboxd's (ReservedHeader, OwnHeaders).
// The decoder refuses such events already; the publisher checks again
// where records are made, so that no source of events can put a second
// copy of outboxd's header on a record.
func (m *Mapping) ReservedIn(hs []Header) (string, bool) {
	id, key := or(m.IDHeader, HeaderOutboxID), or(m.KeyHeader, HeaderAggregateID)
	for _, h := range hs {
		if ReservedHeader(h.Key) || h.Key != noHeader && (h.Key == id || h.Key == key) {
			return h.Key, true
		}
	}
	return "", false
}
