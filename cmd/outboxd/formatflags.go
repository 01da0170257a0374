package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/sr"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/format"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/publisher"
)

// formatOpts are the flags of the message formats: Schema Registry formats
// and CloudEvents (docs/formats.md).
type formatOpts struct {
	cfg                            format.Config
	valueFormat, keyFormat         string
	strategy, cloudEvents          string
	registryURL                    string
	registryUser, registryPassword string
	registryCAFile                 string
	valueSchemaFile, keySchemaFile string
}

func (f *formatOpts) addFlags(fs *flagSet) {
	fs.StringVar(&f.valueFormat, "value-format", "", "write values as json (checked), avro, protobuf or json-schema (Schema Registry wire format: the JSON payload converted to the subject's schema); empty: the payload's bytes as stored. A payload that does not fit is a bad event (--dead-letter-topic, --skip-bad-event)", inShape, choices(string(format.JSON), string(format.Avro), string(format.Protobuf), string(format.JSONSchema)))
	fs.StringVar(&f.keyFormat, "key-format", "", "write keys as string (the aggregate id, the default) or avro, protobuf or json-schema (the subject <topic>-key's schema: a string schema, or a record when the aggregate id is a JSON object)", inShape, choices(string(format.String), string(format.Avro), string(format.Protobuf), string(format.JSONSchema)))
	fs.StringVar(&f.registryURL, "schema-registry-url", "", "Confluent-compatible Schema Registry base URL (comma-separated for several), e.g. http://registry:8081 or Apicurio's http://host:8080/apis/ccompat/v7", inKafka, doc("Confluent-compatible Schema Registry base URL (comma-separated for several), e.g. `http://registry:8081` or Apicurio's `http://host:8080/apis/ccompat/v7`; must be http(s) ([formats](formats.md))"))
	fs.StringVar(&f.registryUser, "schema-registry-user", "", "Schema Registry basic-auth user", inKafka)
	fs.StringVar(&f.registryPassword, "schema-registry-password", "", "Schema Registry basic-auth password (prefer OUTBOXD_SCHEMA_REGISTRY_PASSWORD)", inKafka, secret, doc("Schema Registry basic-auth password; prefer `OUTBOXD_SCHEMA_REGISTRY_PASSWORD` to the flag"))
	fs.StringVar(&f.registryCAFile, "schema-registry-ca-file", "", "PEM CA bundle to verify an https Schema Registry with (default: the system's)", inKafka, doc("PEM CA bundle to verify an https Schema Registry with (default: the system's); must exist"))
	fs.StringVar(&f.strategy, "subject-name-strategy", string(format.TopicName), "subject of a record's schema: topic (<topic>-value, <topic>-key), record (the event type) or topic-record (<topic>-<event type>), as Confluent's TopicNameStrategy, RecordNameStrategy and TopicRecordNameStrategy", inShape, choices(string(format.TopicName), string(format.RecordName), string(format.TopicRecordName)))
	fs.IntVar(&f.cfg.Value.SchemaID, "value-schema-id", 0, "use this schema id for every value instead of the subject's latest version", inShape)
	fs.IntVar(&f.cfg.Value.SchemaVersion, "value-schema-version", 0, "use this version of each value subject instead of its latest", inShape)
	fs.IntVar(&f.cfg.Key.SchemaID, "key-schema-id", 0, "use this schema id for every key", inShape)
	fs.IntVar(&f.cfg.Key.SchemaVersion, "key-schema-version", 0, "use this version of each key subject", inShape)
	fs.StringVar(&f.valueSchemaFile, "value-schema-file", "", "with --auto-register-schemas: the schema registered under a value subject that has none", inShape)
	fs.StringVar(&f.keySchemaFile, "key-schema-file", "", "with --auto-register-schemas: the schema registered under a key subject that has none", inShape)
	fs.StringVar(&f.cfg.Value.Message, "value-proto-message", "", "protobuf: the message (full name) of the subject's schema to write; empty: its first", inShape)
	fs.BoolVar(&f.cfg.AutoRegister, "auto-register-schemas", false, "register --value-schema-file / --key-schema-file under a subject that has no schema (off: producers should not invent schemas; a missing subject makes outboxd retry)", inShape)
	fs.DurationVar(&f.cfg.CacheTTL, "schema-cache-ttl", 0, "how long a subject's latest version is used before it is looked up again (a new compatible version is picked up without a restart); 0: 30s", inShape)
	fs.StringVar(&f.cloudEvents, "cloudevents", "", "CloudEvents Kafka binding: binary (ce_* headers and content-type; the value in --value-format) or structured (application/cloudevents+json values); empty: off", inShape, choices(string(format.Binary), string(format.Structured)))
	fs.StringVar(&f.cfg.Source, "cloudevents-source", "", "ce_source of every event (a URI reference); empty: the database's identity, postgresql://HOST:PORT/DBNAME/SCHEMA.TABLE", inShape)
}

// config resolves the flags into f.cfg (schema files read, the default
// CloudEvents source from --pg-dsn) and checks them against the others.
func (f *formatOpts) config(o *options) (format.Config, error) {
	c := f.cfg
	c.Value.Format, c.Key.Format = format.Format(f.valueFormat), format.Format(f.keyFormat)
	c.Strategy, c.CloudEvents = format.Strategy(f.strategy), format.CloudEvents(f.cloudEvents)
	c.IDHeader, c.TypeHeader = o.pub.IDHeader, outbox.HeaderEventType
	var errs []error
	for _, s := range []struct {
		flag, path string
		dst        *string
	}{{"--value-schema-file", f.valueSchemaFile, &c.Value.Schema}, {"--key-schema-file", f.keySchemaFile, &c.Key.Schema}} {
		if s.path == "" {
			continue
		}
		b, err := os.ReadFile(s.path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.flag, err))
			continue
		}
		*s.dst = string(b)
	}
	if c.CloudEvents != format.NoCloudEvents && c.Source == "" {
		c.Source = databaseSource(o)
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.NeedsRegistry() && f.registryURL == "" {
		errs = append(errs, errors.New("--value-format/--key-format avro, protobuf and json-schema need --schema-registry-url"))
	}
	if c.Value.Format != format.Raw && o.pub.ValueEncoding == outbox.JSONString {
		errs = append(errs, errors.New("--value-format writes the payload itself: drop --value-encoding json-string (or --format debezium's), or --value-format"))
	}
	if binaryValue := c.Value.Format == format.Avro || c.Value.Format == format.Protobuf || c.Value.Format == format.JSONSchema ||
		c.CloudEvents == format.Structured; binaryValue {
		// A hook gets the record's value as $3: encoded, it is no longer
		// the payload (and a wire format's bytes are not text).
		hooks, _ := outbox.ParseHooks(o.hooks) // validateRun reports a bad one
		for topic, sql := range hooks {
			if strings.Contains(sql, "$3") {
				errs = append(errs, fmt.Errorf("--hook for %q uses $3, the payload, which --value-format %s / --cloudevents %s replace with the encoded value: use $1 and $2 only", topic, c.Value.Format, c.CloudEvents))
			}
		}
	}
	if k := c.Key.Format; k != format.Raw && k != format.String && o.pub.KeyEncoding == outbox.JSONString {
		errs = append(errs, errors.New("--key-format writes the key itself: drop --key-encoding json-string, or --key-format"))
	}
	return c, errors.Join(errs...)
}

// databaseSource is the default ce_source: where the events come from,
// without credentials.
func databaseSource(o *options) string {
	pc, err := pgconn.ParseConfig(o.pgDSN)
	if err != nil {
		return ""
	}
	u := url.URL{Scheme: "postgresql", Host: fmt.Sprintf("%s:%d", pc.Host, pc.Port), Path: "/" + pc.Database + "/" + o.slot.Schema + "." + o.slot.Table}
	return u.String()
}

// encoder builds the publisher's Encoder, nil when no flag asks for one.
// The registry client is franz-go's pkg/sr.
func (f *formatOpts) encoder(o *options, log *zap.Logger, reg prometheus.Registerer) (publisher.Encoder, error) {
	c, err := f.config(o)
	if err != nil || !c.Enabled() {
		return nil, err
	}
	var cl format.Registry
	if c.NeedsRegistry() {
		if cl, err = f.client(); err != nil {
			return nil, err
		}
	}
	return format.NewEncoder(c, cl, log, reg)
}

// client is the Schema Registry client the flags describe.
func (f *formatOpts) client() (*sr.Client, error) {
	opts := []sr.ClientOpt{sr.URLs(strings.Split(f.registryURL, ",")...), sr.UserAgent("outboxd")}
	if f.registryUser != "" {
		opts = append(opts, sr.BasicAuth(f.registryUser, f.registryPassword))
	}
	if f.registryCAFile != "" {
		pem, err := os.ReadFile(f.registryCAFile)
		if err != nil {
			return nil, fmt.Errorf("--schema-registry-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--schema-registry-ca-file %s: no PEM certificate in it", f.registryCAFile)
		}
		opts = append(opts, sr.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("--schema-registry-url: %w", err)
	}
	return cl, nil
}

// checkRegistry asks the registry for its subjects, as config check
// --connect's item: a wrong URL or refused credentials show there. run
// itself does not stop on it; its sessions retry until the registry
// answers.
func (f *formatOpts) checkRegistry(ctx context.Context) error {
	cl, err := f.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cl.Subjects(ctx); err != nil {
		return fmt.Errorf("list subjects: %w", err)
	}
	return nil
}
