package replication

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// debeziumRelation is the outbox table of Debezium's Outbox Event Router
// documentation, with a headers column and a bigint epoch timestamp.
func debeziumRelation() []byte {
	return encodeRelation(outboxRel, "public", "outbox",
		column{"id", oidUUID}, column{"aggregatetype", oidVarchar}, column{"aggregateid", oidVarchar},
		column{"type", oidVarchar}, column{"payload", oidJSONB}, column{"timestamp", oidInt8}, column{"headers", oidJSONB})
}

func debeziumConfig() DecoderConfig {
	return DecoderConfig{
		Columns:       Columns{ID: "id", AggregateID: "aggregateid", Payload: "payload", CreatedAt: "timestamp", EventType: "-"},
		TopicTemplate: "outbox.event.{aggregatetype}",
		HeaderColumns: []HeaderColumn{{Column: "type", Header: "eventType"}},
	}
}

func TestDecodeMappedColumns(t *testing.T) {
	const uuid = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	tests := []struct {
		name   string
		cfg    DecoderConfig
		rel    []byte
		insert []byte
		want   Event
	}{
		{
			name: "uuid id, topic template, header column, headers jsonb, epoch-millisecond timestamp",
			cfg:  debeziumConfig(),
			rel:  debeziumRelation(),
			insert: encodeInsert(outboxRel, txt(uuid), txt("Order"), txt("1"), txt("OrderCreated"), txt(`{"id": 1}`),
				txt("1556890294344"), txt(`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "congo=t61rcWkgMzE"}`)),
			want: Event{UUID: uuid, AggregateID: "1", Topic: "outbox.event.Order", Payload: []byte(`{"id": 1}`),
				CreatedAt: time.UnixMilli(1556890294344).UTC(),
				Headers: []Header{{Key: "eventType", Value: "OrderCreated"},
					{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, {Key: "tracestate", Value: "congo=t61rcWkgMzE"}}},
		},
		{
			name:   "NULL placeholder: no topic; NULL header column and headers: no headers",
			cfg:    debeziumConfig(),
			rel:    debeziumRelation(),
			insert: encodeInsert(outboxRel, txt(uuid), null, txt("1"), null, txt(`{}`), null, null),
			want:   Event{UUID: uuid, AggregateID: "1", Payload: []byte(`{}`)},
		},
		{
			name:   "JSON null and an empty object in headers: no headers",
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"headers", oidJSON}),
			insert: encodeInsert(outboxRel, txt("7"), txt("a"), txt("p"), txt(" null ")),
			want:   Event{ID: 7, AggregateID: "a", Payload: []byte("p")},
		},
		{
			name:   "several placeholders and literal text; the topic column is not read",
			cfg:    DecoderConfig{TopicTemplate: "{region}.orders.{kind}.v1"},
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"topic", oidText}, column{"region", oidText}, column{"kind", oidText}),
			insert: encodeInsert(outboxRel, txt("8"), txt("a"), txt("p"), txt("ignored"), txt("eu"), txt("created")),
			want:   Event{ID: 8, AggregateID: "a", Payload: []byte("p"), Topic: "eu.orders.created.v1"},
		},
		{
			name:   "an optional column turned off with \"-\" is not read",
			cfg:    DecoderConfig{Columns: Columns{Headers: "-", EventType: "-"}},
			rel:    encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"headers", oidText}, column{"event_type", oidText}),
			insert: encodeInsert(outboxRel, txt("9"), txt("a"), txt("p"), txt("not json"), txt("E")),
			want:   Event{ID: 9, AggregateID: "a", Payload: []byte("p")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.cfg)
			got := decodeAll(t, d, begin(1), tt.rel, tt.insert)
			if got[2].Kind != KindEvent {
				t.Fatalf("Kind = %v, want event", got[2].Kind)
			}
			if s := diffEvent(got[2].Event, tt.want); s != "" {
				t.Error(s)
			}
		})
	}
}

func TestDecodeMappingErrors(t *testing.T) {
	const uuid = "4d47e190-0402-4048-bc2c-89dd54343cdc"
	tests := []struct {
		name    string
		cfg     DecoderConfig
		rel     []byte
		insert  []byte
		want    error
		message string
	}{
		{
			name:    "text id",
			rel:     encodeRelation(outboxRel, "public", "outbox", column{"id", oidText}, column{"aggregate_id", oidText}, column{"payload", oidText}),
			insert:  encodeInsert(outboxRel, txt("x"), txt("a"), txt("p")),
			want:    ErrColumnType,
			message: `"id" (the id) has type OID 25`,
		},
		{
			name:    "headers column of type text",
			rel:     encodeRelation(outboxRel, "public", "outbox", column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"payload", oidText}, column{"headers", oidText}),
			insert:  encodeInsert(outboxRel, txt("1"), txt("a"), txt("p"), txt("{}")),
			want:    ErrColumnType,
			message: `(the headers) has type OID 25`,
		},
		{
			name:    "template column missing",
			cfg:     DecoderConfig{TopicTemplate: "outbox.event.{aggregatetype}"},
			rel:     outboxRelation(),
			insert:  outboxInsert(1, "a"),
			want:    ErrMissingColumn,
			message: `has no column "aggregatetype"`,
		},
		{
			name:    "header column missing",
			cfg:     DecoderConfig{HeaderColumns: []HeaderColumn{{Column: "type", Header: "eventType"}}},
			rel:     outboxRelation(),
			insert:  outboxInsert(1, "a"),
			want:    ErrMissingColumn,
			message: `has no column "type"`,
		},
		{
			name:    "headers not an object of strings",
			cfg:     debeziumConfig(),
			rel:     debeziumRelation(),
			insert:  encodeInsert(outboxRel, txt(uuid), txt("Order"), txt("1"), txt("T"), txt(`{}`), null, txt(`{"n": 1}`)),
			want:    ErrBadValue,
			message: `outbox row id=` + uuid + `: column "headers" sets header "n" to a number`,
		},
		{
			name:    "headers an array",
			cfg:     debeziumConfig(),
			rel:     debeziumRelation(),
			insert:  encodeInsert(outboxRel, txt(uuid), txt("Order"), txt("1"), txt("T"), txt(`{}`), null, txt(`["a"]`)),
			want:    ErrBadValue,
			message: `not a JSON object of string values`,
		},
		{
			name:    "epoch timestamp not an integer",
			cfg:     debeziumConfig(),
			rel:     debeziumRelation(),
			insert:  encodeInsert(outboxRel, txt(uuid), txt("Order"), txt("1"), txt("T"), txt(`{}`), txt("1.5"), null),
			want:    ErrBadValue,
			message: `column "timestamp" is not an integer`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(tt.cfg)
			decodeAll(t, d, begin(1), tt.rel)
			_, err := d.Decode(tt.insert)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.message) {
				t.Fatalf("err = %v, want %v containing %q", err, tt.want, tt.message)
			}
		})
	}
}

func TestDecoderConfigValidate(t *testing.T) {
	for _, tmpl := range []string{"outbox.{", "outbox.}x", "{}", "fixed", "a.{b{c}}"} {
		if err := (DecoderConfig{TopicTemplate: tmpl}).Validate(); err == nil {
			t.Errorf("template %q: Validate() = nil, want an error", tmpl)
		}
	}
	if err := (DecoderConfig{TopicTemplate: "outbox.event.{aggregatetype}"}).Validate(); err != nil {
		t.Errorf("valid template: %v", err)
	}
	if err := (DecoderConfig{HeaderColumns: []HeaderColumn{{Column: "type"}}}).Validate(); err == nil {
		t.Error("header column without a header name: Validate() = nil, want an error")
	}
}

func FuzzJSONHeaders(f *testing.F) {
	for _, s := range []string{`{}`, `null`, `{"a":"b","c":"d"}`, `{"a":1}`, `[1]`, `{"a":"b"} x`, `"s"`, `{"a":{"b":"c"}}`, `{"a":null,"b":"c"}`, `{"outbox-id":"1"}`} {
		f.Add([]byte(s))
	}
	// Whatever the input, appendJSONHeaders agrees with encoding/json: it
	// accepts exactly the documents that unmarshal into a map of strings
	// or nulls naming no reserved header, and returns their string
	// members.
	d := NewDecoder(DecoderConfig{})
	f.Fuzz(func(t *testing.T, v []byte) {
		hs, bad := d.appendJSONHeaders(nil, v)
		var m map[string]*string
		want := json.Unmarshal(v, &m) == nil
		reserved := false
		for k := range m {
			reserved = reserved || d.reserved(k)
		}
		switch {
		case !want && bad == "":
			t.Fatalf("appendJSONHeaders(%q) accepted what json.Unmarshal into map[string]*string refuses", v)
		case !want || reserved:
			// A reserved name is refused unless all its members are
			// null (a repeated key in a json column: Unmarshal keeps the
			// last).
			return
		case bad != "":
			t.Fatalf("appendJSONHeaders(%q): %s; json.Unmarshal into map[string]*string accepts it", v, bad)
		}
		got := make(map[string]string, len(hs))
		for _, h := range hs {
			got[h.Key] = h.Value
		}
		for k, v := range m {
			if g, ok := got[k]; v != nil && (!ok || g != *v) {
				t.Fatalf("header %q = %q (%v), Unmarshal has %q", k, g, ok, *v)
			}
		}
		for k := range got {
			if _, ok := m[k]; !ok {
				t.Fatalf("header %q is not in the document", k)
			}
		}
	})
}
