package replication

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/slot"
)

// Columns names the outbox table's columns.
type Columns struct {
	// ID is the event id: bigint, integer, smallint or uuid (required).
	ID string
	// AggregateID is the record key (required).
	AggregateID string
	// Topic is the topic (optional; see DecoderConfig.TopicTemplate).
	Topic string
	// Payload is the record value (required).
	Payload string
	// CreatedAt is the record timestamp (optional): a timestamptz or
	// timestamp, or an integer of milliseconds since the Unix epoch.
	CreatedAt string
	// EventType is an optional column placed in the event-type header.
	EventType string
	// Headers is an optional jsonb (or json) column whose object becomes
	// record headers, e.g. {"traceparent": "00-…"}: a string member is a
	// header, a null one none; any other value, or a reserved name (see
	// DecoderConfig.ReservedHeaders), makes the row a bad event.
	Headers string
}

// DefaultColumns returns the column names of the standard outbox table: id,
// aggregate_id, topic, payload, created_at, event_type, headers.
func DefaultColumns() Columns {
	return Columns{
		ID:          "id",
		AggregateID: "aggregate_id",
		Topic:       "topic",
		Payload:     "payload",
		CreatedAt:   "created_at",
		EventType:   "event_type",
		Headers:     "headers",
	}
}

// DecoderConfig configures a Decoder. Empty fields take their defaults:
// schema "public", table "outbox", and the names of DefaultColumns. A
// column set to "-" is not read at all (only the optional ones: Topic,
// CreatedAt, EventType, Headers).
type DecoderConfig struct {
	Schema, Table string
	Columns       Columns
	// TopicTemplate, when set, routes every row to the topic it renders
	// instead of reading Columns.Topic: each {column} is replaced by that
	// column's text, e.g. "outbox.event.{aggregatetype}". A row whose
	// placeholder column is NULL has no topic (as a row with a NULL topic
	// column: the default topic, or a poison event).
	TopicTemplate string
	// Messages decodes logical decoding messages of prefix MessagePrefix
	// (written by outbox_emit) as events: the table-less outbox. Only those
	// whose MAC verifies with MessageKey become events; the others are
	// KindRejected. One that verifies but cannot be an event (its fields do
	// not parse, its headers break the rule of Columns.Headers) is KindBad,
	// as a bad row: outbox_emit wrote it in a transaction that committed. The stream asks pgoutput for them (PostgreSQL 14 or
	// later) only when outbox_emit's key is installed, and fills in
	// MessageKey when it starts; MessagesRequired makes a missing key an
	// error instead (--source=messages).
	Messages         bool
	MessagesRequired bool
	MessageKey       *MessageKey
	// NullPayload makes a NULL payload an event with a nil Payload (a
	// record with a null value: a tombstone, as Debezium's Outbox Event
	// Router sends it) instead of a bad event.
	NullPayload bool
	// HeaderColumns places further columns as headers, in this order,
	// after the event-type header and before those of Columns.Headers. A
	// NULL value sets no header.
	HeaderColumns []HeaderColumn
	// ReservedHeaders are header names the record mapping sets besides the
	// ones outboxd always does (outbox.ReservedHeader): its renamed id and
	// key headers (outbox.Mapping.OwnHeaders). An event whose own headers
	// (the headers column, an outbox_emit headers object) name a reserved
	// header, or a header column's, is a bad event: the record would carry
	// the name twice, and a reader could take the writer's value for
	// outboxd's.
	ReservedHeaders []string
}

// HeaderColumn places the text of Column in the header named Header.
type HeaderColumn struct {
	Column, Header string
}

// columnOff, as a column name in DecoderConfig.Columns, turns an optional
// column off.
const columnOff = "-"

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// columns returns the column names the decoder reads: the defaults filled
// in, "" for an optional column turned off ("-") and for the topic column
// when a template routes.
func (c DecoderConfig) columns() Columns {
	def := DefaultColumns()
	off := func(s string) string {
		if s == columnOff {
			return ""
		}
		return s
	}
	cols := Columns{
		ID:          or(c.Columns.ID, def.ID),
		AggregateID: or(c.Columns.AggregateID, def.AggregateID),
		Topic:       off(or(c.Columns.Topic, def.Topic)),
		Payload:     or(c.Columns.Payload, def.Payload),
		CreatedAt:   off(or(c.Columns.CreatedAt, def.CreatedAt)),
		EventType:   off(or(c.Columns.EventType, def.EventType)),
		Headers:     off(or(c.Columns.Headers, def.Headers)),
	}
	if c.TopicTemplate != "" {
		cols.Topic = ""
	}
	return cols
}

// TableColumns returns the columns the decoder reads, for slot.Preflight to
// check before streaming: required ones must exist, and each must have a
// type the decoder reads in its role. haveDefaultTopic makes the topic
// column optional.
func (c DecoderConfig) TableColumns(haveDefaultTopic bool) []slot.Column {
	cols := c.columns()
	out := []slot.Column{
		{Name: cols.ID, Role: "id", Required: true, Types: []string{"bigint", "integer", "smallint", "uuid"}},
		{Name: cols.AggregateID, Role: "key", Required: true},
		{Name: cols.Payload, Role: "payload", Required: true},
	}
	optional := func(name, role string, types ...string) {
		if name != "" {
			out = append(out, slot.Column{Name: name, Role: role, Types: types})
		}
	}
	if cols.Topic != "" {
		out = append(out, slot.Column{Name: cols.Topic, Role: "topic", Required: !haveDefaultTopic})
	}
	optional(cols.CreatedAt, "timestamp", "timestamp with time zone", "timestamp without time zone", "text", "character varying", "bigint", "integer")
	optional(cols.EventType, "event type")
	optional(cols.Headers, "headers", "jsonb", "json")
	if t, _ := parseTopicTemplate(c.TopicTemplate); t != nil {
		for _, col := range t.cols {
			out = append(out, slot.Column{Name: col, Role: "topic template placeholder", Required: true})
		}
	}
	for _, h := range c.HeaderColumns {
		out = append(out, slot.Column{Name: h.Column, Role: "header " + h.Header, Required: true})
	}
	return out
}

// Validate checks the topic template and the header columns.
func (c DecoderConfig) Validate() error {
	var errs []error
	if _, err := parseTopicTemplate(c.TopicTemplate); err != nil {
		errs = append(errs, err)
	}
	for _, h := range c.HeaderColumns {
		switch {
		case h.Column == "" || h.Header == "":
			errs = append(errs, fmt.Errorf("replication: header column %q=%q: both the column and the header name must be set (column=header)", h.Column, h.Header))
		case outbox.ReservedHeader(h.Header) || slices.Contains(c.ReservedHeaders, h.Header):
			errs = append(errs, fmt.Errorf("replication: header column %q=%q: header %q is one outboxd sets itself: choose another name", h.Column, h.Header, h.Header))
		}
	}
	return errors.Join(errs...)
}

// topicTemplate is a parsed TopicTemplate: literal text and placeholders
// alternate; cols[i] is the column of the placeholder after lits[i].
// len(lits) == len(cols)+1.
type topicTemplate struct {
	lits []string
	cols []string
}

// parseTopicTemplate parses "prefix.{column}.suffix"; nil for "".
func parseTopicTemplate(s string) (*topicTemplate, error) {
	if s == "" {
		return nil, nil
	}
	t := &topicTemplate{}
	rest := s
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			if strings.IndexByte(rest, '}') >= 0 {
				return nil, fmt.Errorf("replication: topic template %q has a '}' without '{': write placeholders as {column}", s)
			}
			t.lits = append(t.lits, rest)
			break
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("replication: topic template %q has an unclosed '{': write placeholders as {column}", s)
		}
		col := rest[open+1 : open+end]
		if col == "" || strings.ContainsAny(col, "{") {
			return nil, fmt.Errorf("replication: topic template %q has an empty or nested placeholder: write placeholders as {column}", s)
		}
		if strings.IndexByte(rest[:open], '}') >= 0 {
			return nil, fmt.Errorf("replication: topic template %q has a '}' without '{': write placeholders as {column}", s)
		}
		t.lits = append(t.lits, rest[:open])
		t.cols = append(t.cols, col)
		rest = rest[open+end+1:]
	}
	if len(t.cols) == 0 {
		return nil, fmt.Errorf("replication: topic template %q has no {column} placeholder: for one fixed topic use the default topic instead", s)
	}
	return t, nil
}

// resolve checks the outbox relation against the mapping (required columns,
// their types, the template's and the header columns) and records where the
// template's and header columns are. It returns the first problem.
func (d *Decoder) resolve(rel *relation, seen *[numRoles]bool) error {
	missing := func(col string) error {
		return &MissingColumnError{Schema: d.schema, Table: d.table, Column: col}
	}
	for _, req := range [...]struct {
		r    role
		name string
	}{{roleID, d.cols.ID}, {roleAggregateID, d.cols.AggregateID}, {rolePayload, d.cols.Payload}} {
		if !seen[req.r] {
			return missing(req.name)
		}
	}
	for _, c := range [...]struct {
		r    role
		name string
		role string
		ok   []uint32
		want string
	}{
		{roleID, d.cols.ID, "id", []uint32{oidInt8, oidInt4, oidInt2, oidUUID}, "bigint, integer, smallint or uuid"},
		{roleCreatedAt, d.cols.CreatedAt, "timestamp", []uint32{oidTimestamptz, oidTimestamp, oidText, oidVarchar, oidInt8, oidInt4}, "timestamptz, timestamp (or its ISO text), or bigint milliseconds since the Unix epoch"},
		{roleHeaders, d.cols.Headers, "headers", []uint32{oidJSONB, oidJSON}, "jsonb or json (an object of string values)"},
	} {
		if !seen[c.r] {
			continue
		}
		fits := false
		for _, o := range c.ok {
			fits = fits || rel.oid[c.r] == o
		}
		if !fits {
			return &ColumnTypeError{Schema: d.schema, Table: d.table, Column: c.name, Role: c.role, OID: rel.oid[c.r], Want: c.want}
		}
	}
	index := func(col string) int {
		for i, n := range rel.names {
			if n == col {
				return i
			}
		}
		return -1
	}
	if d.tmpl != nil {
		rel.tmpl = make([]int, len(d.tmpl.cols))
		for i, col := range d.tmpl.cols {
			if rel.tmpl[i] = index(col); rel.tmpl[i] < 0 {
				return missing(col)
			}
		}
	}
	rel.hdr = make([]int, len(d.hdrCols))
	for i, h := range d.hdrCols {
		if rel.hdr[i] = index(h.Column); rel.hdr[i] < 0 {
			return missing(h.Column)
		}
	}
	return nil
}

// renderTopic renders the topic template with the values of the row in
// d.row; "" when a placeholder column is NULL.
func (d *Decoder) renderTopic(b []byte, rel *relation) string {
	buf := d.topicBuf[:0]
	for i, lit := range d.tmpl.lits {
		buf = append(buf, lit...)
		if i == len(rel.tmpl) {
			break
		}
		s := d.row[rel.tmpl[i]]
		if s.kind != 't' {
			return ""
		}
		buf = append(buf, b[s.start:s.end]...)
	}
	d.topicBuf = buf
	return d.intern(buf, &d.lastTopic)
}

// appendJSONHeaders appends the headers v, a JSON object (or JSON null:
// none), asks for to hs, in document order; bad says why it cannot: the one
// rule of both the headers column and outbox_emit's headers object. A
// string member is a header. A null member is none: the natural meaning of
// an optional header, as jsonb_build_object('traceparent', NULL::text)
// writes it. Any other value (a number, a boolean, an object, an array) is
// refused rather than sent as its JSON text, which would differ between a
// json and a jsonb column and which no reader could tell from a string. A
// name d reserves (reserved) is refused too.
func (d *Decoder) appendJSONHeaders(hs []Header, v []byte) (out []Header, bad string) {
	dec := json.NewDecoder(bytes.NewReader(v))
	notObject := func() ([]Header, string) {
		return hs, "is not a JSON object of string values: " + quote(v)
	}
	tok, err := dec.Token()
	if err != nil {
		return notObject()
	}
	if tok == nil {
		if _, err = dec.Token(); err != io.EOF {
			return notObject()
		}
		return hs, ""
	}
	if tok != json.Delim('{') {
		return notObject()
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return notObject()
		}
		name := k.(string)
		val, err := dec.Token()
		if err != nil {
			return notObject()
		}
		switch val := val.(type) {
		case string:
			if d.reserved(name) {
				return hs, fmt.Sprintf("sets header %q, which outboxd sets itself: rename it", name)
			}
			hs = append(hs, Header{Key: name, Value: val})
		case nil:
			// No header; a reserved name with null sets nothing either.
		default:
			return hs, fmt.Sprintf("sets header %q to %s: a header value must be a JSON string (or null: no header)", name, jsonKind(val))
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return notObject()
	}
	if _, err = dec.Token(); err != io.EOF {
		return notObject()
	}
	return hs, ""
}

// jsonKind names the JSON type of a json.Decoder token that is a value.
func jsonKind(tok json.Token) string {
	switch tok.(type) {
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case json.Delim:
		if tok == json.Delim('[') {
			return "an array"
		}
		return "an object"
	}
	return fmt.Sprintf("%T", tok)
}

// reserved reports whether an event's own headers must not name header:
// outboxd's (outbox.ReservedHeader), the mapping's
// (DecoderConfig.ReservedHeaders) and the header columns'.
func (d *Decoder) reserved(header string) bool {
	if outbox.ReservedHeader(header) || slices.Contains(d.reservedHdrs, header) {
		return true
	}
	for _, h := range d.hdrCols {
		if h.Header == header {
			return true
		}
	}
	return false
}
