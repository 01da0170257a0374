// Package format turns an outbox event's record into the formats Kafka
// pipelines already run on, and back: Schema Registry formats (Avro,
// Protobuf, JSON Schema) in the Confluent wire format — magic byte 0, the
// schema id as 4 big-endian bytes, Protobuf's message indexes, the body —
// and CloudEvents in the Kafka protocol binding's binary (ce_* headers) and
// structured (application/cloudevents+json) modes.
//
// It is a package of its own, not part of kafka/ or publisher/, because
// three sides use it alike — the CDC pipeline, the polling source and the
// consumer — and because its only tie to Kafka is the record it rewrites:
// [Encoder.Encode] takes a kafka.Record whose value is the event's JSON
// payload and leaves the record in its wire format, [Decoder.Decode] takes
// a record's value and headers and gives the value back.
//
// A payload that does not fit its schema is the event's fault, not the
// registry's: [Encoder.Encode] returns a [*BadPayloadError], which matches
// kafka.ErrPoison, so the caller's bad-event path (dead-letter topic, or a
// halt naming --skip-bad-event) takes it. A registry that cannot be reached
// or a subject that has no schema yet is a [*RegistryError]: transient,
// the caller restarts from its last confirmed position and nothing past the
// event is confirmed. Never a silently wrong record.
//
// The codecs are libraries: github.com/hamba/avro/v2 (Avro),
// google.golang.org/protobuf with github.com/bufbuild/protocompile
// (Protobuf from the registry's .proto text), and
// github.com/santhosh-tekuri/jsonschema/v6 (JSON Schema); the registry
// client is github.com/twmb/franz-go/pkg/sr. docs/formats.md says why.
package format
