package format

import (
	"fmt"
	"time"
)

// Format is how a record's value (or key) is written.
type Format string

const (
	// Raw writes the payload's bytes as stored: outboxd's behaviour
	// without --value-format.
	Raw Format = ""
	// JSON checks that the payload is JSON and writes it as is.
	JSON Format = "json"
	// Avro converts the JSON payload to the registry's Avro schema.
	Avro Format = "avro"
	// Protobuf converts the JSON payload (Protobuf's JSON mapping) to the
	// registry's Protobuf message.
	Protobuf Format = "protobuf"
	// JSONSchema validates the JSON payload against the registry's JSON
	// Schema and writes it as is, behind the wire format's header.
	JSONSchema Format = "json-schema"
	// String is the key's default: the aggregate id's bytes.
	String Format = "string"
)

// registry reports whether f is written in the Schema Registry wire format.
func (f Format) registry() bool { return f == Avro || f == Protobuf || f == JSONSchema }

// ContentType is the media type of data in the format, for CloudEvents'
// content-type (datacontenttype).
func (f Format) ContentType() string {
	switch f {
	case Avro:
		return "application/avro"
	case Protobuf:
		return "application/protobuf"
	default:
		return "application/json"
	}
}

// Strategy names a record's subject in the registry, as Confluent's
// serializers do.
type Strategy string

const (
	// TopicName is "<topic>-value" (or "-key"): one schema per topic.
	TopicName Strategy = "topic"
	// RecordName is the record's name: one schema per event type, on any
	// topic. The name is the event's type (the event-type header).
	RecordName Strategy = "record"
	// TopicRecordName is "<topic>-<record name>".
	TopicRecordName Strategy = "topic-record"
)

// CloudEvents is the CloudEvents Kafka protocol binding's mode.
type CloudEvents string

const (
	// NoCloudEvents writes no CloudEvents attributes.
	NoCloudEvents CloudEvents = ""
	// Binary puts the attributes in ce_* headers and content-type; the
	// value is the data (in the value format).
	Binary CloudEvents = "binary"
	// Structured writes the whole event as application/cloudevents+json:
	// a JSON payload as data, a registry format's bytes as data_base64.
	Structured CloudEvents = "structured"
)

// Side is one of a record's key and value.
type Side struct {
	Format Format
	// SchemaID pins the schema by its registry id; SchemaVersion pins a
	// version of the subject. Neither: the subject's latest version,
	// looked up again after CacheTTL.
	SchemaID      int
	SchemaVersion int
	// Schema is the schema text registered under the subject when it has
	// none and AutoRegister is set.
	Schema string
	// Message is the Protobuf message to encode with (its full name); ""
	// is the schema's first message.
	Message string
}

// Config says how records are written. The zero value writes them as
// outboxd always did.
type Config struct {
	Value, Key Side
	Strategy   Strategy // "" is TopicName
	// AutoRegister registers Side.Schema under a subject that has none.
	// Off by default: producers should not invent schemas.
	AutoRegister bool
	// CacheTTL is how long a subject's latest version is used before it
	// is looked up again (a new compatible version is picked up without a
	// restart). 0 is 30 s.
	CacheTTL time.Duration

	CloudEvents CloudEvents
	// Source is ce_source (a URI reference): the --cloudevents-source
	// flag, or the database's identity.
	Source string
	// IDHeader and TypeHeader name the headers outboxd set with the
	// event id and type ("" is outbox-id and event-type).
	IDHeader, TypeHeader string
}

// Enabled reports whether c changes records at all.
func (c *Config) Enabled() bool {
	return c.Value.Format != Raw || (c.Key.Format != Raw && c.Key.Format != String) || c.CloudEvents != NoCloudEvents
}

// NeedsRegistry reports whether c needs a Schema Registry.
func (c *Config) NeedsRegistry() bool { return c.Value.Format.registry() || c.Key.Format.registry() }

// Validate reports an unknown setting or one that cannot work.
func (c *Config) Validate() error {
	switch c.Value.Format {
	case Raw, JSON, Avro, Protobuf, JSONSchema:
	default:
		return fmt.Errorf("value format %q is unknown: use json, avro, protobuf or json-schema", c.Value.Format)
	}
	switch c.Key.Format {
	case Raw, String, Avro, Protobuf, JSONSchema:
	default:
		return fmt.Errorf("key format %q is unknown: use string, avro, protobuf or json-schema", c.Key.Format)
	}
	switch c.Strategy {
	case "", TopicName, RecordName, TopicRecordName:
	default:
		return fmt.Errorf("subject name strategy %q is unknown: use topic, record or topic-record", c.Strategy)
	}
	switch c.CloudEvents {
	case NoCloudEvents, Binary, Structured:
	default:
		return fmt.Errorf("cloudevents mode %q is unknown: use binary or structured", c.CloudEvents)
	}
	for _, s := range []struct {
		name string
		side Side
	}{{"value", c.Value}, {"key", c.Key}} {
		if s.side.SchemaID != 0 && s.side.SchemaVersion != 0 {
			return fmt.Errorf("%s: pin a schema by id or by version, not both", s.name)
		}
		if s.side.SchemaID < 0 || s.side.SchemaVersion < 0 {
			return fmt.Errorf("%s: a schema id or version is positive", s.name)
		}
		if !s.side.Format.registry() && (s.side.SchemaID != 0 || s.side.SchemaVersion != 0 || s.side.Schema != "") {
			return fmt.Errorf("%s: a schema is only used with avro, protobuf or json-schema", s.name)
		}
		if c.AutoRegister && s.side.Format.registry() && s.side.Schema == "" && s.side.SchemaID == 0 {
			return fmt.Errorf("%s: auto-registration needs the schema to register (--%s-schema-file)", s.name, s.name)
		}
	}
	if c.CloudEvents != NoCloudEvents && c.Source == "" {
		return fmt.Errorf("cloudevents: no source (ce_source): set --cloudevents-source")
	}
	return nil
}

func (c *Config) cacheTTL() time.Duration {
	if c.CacheTTL <= 0 {
		return 30 * time.Second
	}
	return c.CacheTTL
}
