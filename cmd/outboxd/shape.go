package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Outbox shapes --format selects; each flag below overrides one part.
const (
	formatOutboxd  = "outboxd"
	formatDebezium = "debezium"
)

// shapeOptions are the flags that map an outbox table to records. Empty
// means "as --format says".
type shapeOptions struct {
	format                                          string
	idColumn, keyColumn, payloadColumn, topicColumn string
	timestampColumn, eventTypeColumn, headersColumn string
	topicTemplate                                   string
	headerColumns                                   stringList
	idHeader, keyHeader, keyEncoding, valueEncoding string
}

func addShapeFlags(fs *flagSet, s *shapeOptions) {
	fs.StringVar(&s.format, "format", formatOutboxd, "outbox shape: outboxd (id, aggregate_id, topic, payload, created_at, event_type, headers) or debezium (Debezium's Outbox Event Router defaults: uuid id, aggregateid, payload, topic outbox.event.{aggregatetype}, header id, key and value as JSON strings); the flags below override single parts", inShape,
		choices(formatOutboxd, formatDebezium),
		doc("outbox shape: `outboxd` (id, aggregate_id, topic, payload, created_at, event_type, headers) or `debezium` (Debezium's Outbox Event Router defaults); the `-column`, `-header` and `-encoding` flags and `--topic-template` override single parts ([shapes](shapes.md))"))
	fs.StringVar(&s.idColumn, "id-column", "", "event id column, bigint or uuid (sent in the id header) [format: id]", inShape)
	fs.StringVar(&s.keyColumn, "key-column", "", "record key column [format: aggregate_id / aggregateid]", inShape)
	fs.StringVar(&s.payloadColumn, "payload-column", "", "record value column [format: payload]", inShape)
	fs.StringVar(&s.topicColumn, "topic-column", "", "topic column (\"-\": none) [format: topic / none]", inShape)
	fs.StringVar(&s.topicTemplate, "topic-template", "", "route by a template instead of the topic column: {column} is replaced by the row's value, e.g. 'outbox.event.{aggregatetype}' [format: none / outbox.event.{aggregatetype}]", inShape)
	fs.StringVar(&s.timestampColumn, "timestamp-column", "", "record timestamp column: timestamptz, timestamp or bigint epoch milliseconds; absent or NULL: the commit time (\"-\": none) [format: created_at / none]", inShape)
	fs.StringVar(&s.eventTypeColumn, "event-type-column", "", "column sent in the event-type header (\"-\": none) [format: event_type / none]", inShape)
	fs.StringVar(&s.headersColumn, "headers-column", "", "jsonb column whose object becomes headers, e.g. traceparent: a string member is a header, a null one none, anything else or a name outboxd sets itself (outbox-id, outbox-origin, ce_*, ...) a bad event (\"-\": none) [format: headers / none]", inShape)
	fs.Var(&s.headerColumns, "header-column", "COLUMN=HEADER: send a column's value in a header (repeatable), e.g. type=eventType", inShape)
	fs.StringVar(&s.idHeader, "id-header", "", "header carrying the event id (\"-\": none) [format: outbox-id / id]", inShape)
	fs.StringVar(&s.keyHeader, "key-header", "", "header carrying the key (\"-\": none) [format: aggregate-id / none]", inShape)
	fs.StringVar(&s.keyEncoding, "key-encoding", "", "raw or json-string (the key as a JSON string, as Kafka Connect's JsonConverter writes it) [format: raw / json-string]", inShape, choices("raw", "json-string"))
	fs.StringVar(&s.valueEncoding, "value-encoding", "", "raw or json-string [format: raw / json-string]", inShape, choices("raw", "json-string"))
}

// shape resolves --format and its overrides into the decoder's
// configuration, the record mapping and the columns preflight checks.
func (o *options) shape() error {
	s := &o.shapeOpts
	cols, tmpl, m, err := s.resolve()
	if err != nil {
		return err
	}
	hcs, errs := s.parseHeaderColumns()
	// Under CDC, outbox_emit messages are events as well as the table's
	// rows when outbox_emit's key is installed (pgoutput sends them from
	// PostgreSQL 14 on); --source=messages reads only them, with no table,
	// and needs the key.
	dec := replication.DecoderConfig{Schema: o.slot.Schema, Table: o.slot.Table, Columns: cols, TopicTemplate: tmpl, HeaderColumns: hcs,
		Messages: o.poll.source == sourceCDC || o.poll.source == sourceMessages, MessagesRequired: o.poll.source == sourceMessages,
		// Debezium's router sends a NULL payload as a null value.
		NullPayload: s.format == formatDebezium,
		// A row's own headers must not name the mapping's id and key
		// headers: the record would carry them twice.
		ReservedHeaders: m.OwnHeaders()}
	switch o.poll.source {
	case sourceCDC, sourcePoll, "":
	case sourceMessages:
		// The publication outboxd creates then has no table: only
		// messages arrive.
		o.slot.Tableless = true
	default:
		errs = append(errs, fmt.Errorf("--source %q: use %s, %s or %s", o.poll.source, sourceCDC, sourceMessages, sourcePoll))
	}
	if err := dec.Validate(); err != nil {
		errs = append(errs, err)
	}
	m.DefaultTopic = o.pub.DefaultTopic
	if err := m.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	o.decoder, o.pub.Mapping = dec, m
	o.slot.Columns = dec.TableColumns(o.pub.DefaultTopic != "")
	return nil
}

// resolve is what --format says for the columns, the topic template and the
// mapping, with each override flag that is set in its place.
func (s *shapeOptions) resolve() (cols replication.Columns, tmpl string, m outbox.Mapping, err error) {
	m = outbox.DefaultMapping()
	switch s.format {
	case formatOutboxd, "":
		cols = replication.DefaultColumns()
	case formatDebezium:
		cols = replication.Columns{ID: "id", AggregateID: "aggregateid", Payload: "payload",
			Topic: "-", CreatedAt: "-", EventType: "-", Headers: "-"}
		tmpl = "outbox.event.{aggregatetype}"
		m.IDHeader, m.KeyHeader = "id", "-"
		m.KeyEncoding, m.ValueEncoding = outbox.JSONString, outbox.JSONString
	default:
		return cols, tmpl, m, fmt.Errorf("--format %q: use %s or %s", s.format, formatOutboxd, formatDebezium)
	}
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&cols.ID, s.idColumn)
	set(&cols.AggregateID, s.keyColumn)
	set(&cols.Payload, s.payloadColumn)
	set(&cols.Topic, s.topicColumn)
	set(&cols.CreatedAt, s.timestampColumn)
	set(&cols.EventType, s.eventTypeColumn)
	set(&cols.Headers, s.headersColumn)
	set(&tmpl, s.topicTemplate)
	set(&m.IDHeader, s.idHeader)
	set(&m.KeyHeader, s.keyHeader)
	if s.keyEncoding != "" {
		m.KeyEncoding = outbox.Encoding(s.keyEncoding)
	}
	if s.valueEncoding != "" {
		m.ValueEncoding = outbox.Encoding(s.valueEncoding)
	}
	return cols, tmpl, m, nil
}

// parseHeaderColumns reads the --header-column flags (COLUMN=HEADER), with
// an error for each one written otherwise.
func (s *shapeOptions) parseHeaderColumns() ([]replication.HeaderColumn, []error) {
	var errs []error
	var hcs []replication.HeaderColumn
	for _, hc := range s.headerColumns {
		col, hdr, ok := strings.Cut(hc, "=")
		if !ok || col == "" || hdr == "" {
			errs = append(errs, fmt.Errorf("--header-column %q: write COLUMN=HEADER, e.g. type=eventType", hc))
			continue
		}
		hcs = append(hcs, replication.HeaderColumn{Column: col, Header: hdr})
	}
	return hcs, errs
}
