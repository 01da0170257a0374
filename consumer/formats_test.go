package consumer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxd/outboxd/format"
)

// registryServer serves one Avro schema (id 1, `"string"`) the way a
// Confluent-compatible registry does, to franz-go's client.
func registryServer(t *testing.T) *sr.Client {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/schemas/ids/1" {
			http.Error(w, `{"error_code":40403,"message":"Schema not found"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		_, _ = w.Write([]byte(`{"schema":"\"string\""}`))
	}))
	t.Cleanup(s.Close)
	cl, err := sr.NewClient(sr.URLs(s.URL))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func TestDecodeHandsTheHandlerTheDecodedValue(t *testing.T) {
	dec := format.NewDecoder(registryServer(t))
	var got *Decoded
	h := Decode(dec, format.Avro, func(_ context.Context, _ pgx.Tx, d *Decoded) error {
		got = d
		return nil
	})
	m := &Message{Topic: "t", Value: []byte("\x00\x00\x00\x00\x01\x0ahello"), Headers: []Header{
		{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte("7")}, {Key: "ce_type", Value: []byte("greeting")},
	}}
	if err := h.Handle(context.Background(), nil, m); err != nil {
		t.Fatal(err)
	}
	if got.Value.Decoded != "hello" || got.Value.SchemaID != 1 || got.CloudEvent == nil || got.CloudEvent.ID != "7" || got.CloudEvent.Type != "greeting" {
		t.Fatalf("decoded %+v, cloudevent %+v", got.Value, got.CloudEvent)
	}
	// A value that is not the wire format is a domain error: dead-lettered.
	err := h.Handle(context.Background(), nil, &Message{Topic: "t", Value: []byte(`{"a":1}`)})
	var de *DomainError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "wire format") {
		t.Fatalf("err = %v, want a DomainError", err)
	}
	// An unknown schema id is the registry's answer, retried.
	err = h.Handle(context.Background(), nil, &Message{Topic: "t", Value: []byte("\x00\x00\x00\x00\x02\x02")})
	if err == nil || errors.As(err, &de) {
		t.Fatalf("err = %v, want a retried registry error", err)
	}
}
