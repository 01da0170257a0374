package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/format"
)

// TestFormatFlagsRefuseWhatCannotWork: format settings that cannot work
// are refused before anything connects, by the validation run and config
// check share.
func TestFormatFlagsRefuseWhatCannotWork(t *testing.T) {
	base := []string{"--pg-dsn", "postgres://u@db:5432/app", "--kafka-brokers", "k1:9092"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--value-format", "avro"}, "need --schema-registry-url"},
		{[]string{"--value-format", "xml"}, `value format "xml" is unknown`},
		{[]string{"--key-format", "json"}, `key format "json" is unknown`},
		{[]string{"--value-format", "avro", "--schema-registry-url", "http://r", "--subject-name-strategy", "x"}, `subject name strategy "x"`},
		{[]string{"--value-format", "avro", "--schema-registry-url", "http://r", "--value-schema-id", "1", "--value-schema-version", "2"}, "by id or by version, not both"},
		{[]string{"--value-format", "avro", "--schema-registry-url", "http://r", "--auto-register-schemas"}, "--value-schema-file"},
		{[]string{"--value-schema-id", "3"}, "only used with avro, protobuf or json-schema"},
		{[]string{"--cloudevents", "both"}, `cloudevents mode "both"`},
		{[]string{"--cloudevents", "structured", "--hook", "t=SELECT $3::text"}, `--hook for "t" uses $3`},
		{[]string{"--format", "debezium", "--value-format", "json"}, "drop --value-encoding json-string"},
		{[]string{"--value-format", "avro", "--schema-registry-url", "http://r", "--auto-register-schemas", "--value-schema-file", "/nonexistent.avsc"}, "--value-schema-file"},
	} {
		o, _, err := parseRun(t, nil, append(append([]string{}, base...), c.args...)...)
		if err != nil {
			t.Fatalf("%v: parse: %v", c.args, err)
		}
		if _, err := o.validateRun(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.args, err, c.want)
		}
	}
	o, _, err := parseRun(t, nil, append(base, "--value-format", "avro", "--schema-registry-url", "http://r", "--cloudevents", "binary", "--table", "events")...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.validateRun(); err != nil {
		t.Fatalf("a valid configuration was refused: %v", err)
	}
	c, err := o.formats.config(o)
	if err != nil || c.Value.Format != format.Avro || c.Source != "postgresql://db:5432/app/public.events" {
		t.Fatalf("config %+v, %v: want ce_source from the DSN without its user", c, err)
	}
}

// TestCheckRegistry: config check --connect's registry item fails on a
// registry that refuses the credentials, and passes on one that answers.
func TestCheckRegistry(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, _ := r.BasicAuth(); u != "outboxd" || p != "right" {
			http.Error(w, `{"error_code":40101,"message":"Unauthorized"}`, http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`["orders-value"]`))
	}))
	defer srv.Close()
	f := formatOpts{registryURL: srv.URL, registryUser: "outboxd", registryPassword: "wrong"}
	if err := f.checkRegistry(context.Background()); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("wrong password: %v", err)
	}
	f.registryPassword = "right"
	if err := f.checkRegistry(context.Background()); err != nil {
		t.Fatal(err)
	}
}
