package replication

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/format"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
)

// headersRelation is a minimal outbox table with a headers column of type
// oid (jsonb or json).
func headersRelation(oid uint32) []byte {
	return encodeRelation(outboxRel, "public", "outbox",
		column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"topic", oidText},
		column{"payload", oidJSONB}, column{"headers", oid})
}

// headerRuleCases are the headers objects both the headers column and
// outbox_emit's messages are decoded by, and what each gives: the headers,
// or a bad event whose reason contains bad.
var headerRuleCases = []struct {
	name    string
	headers string
	want    []Header
	bad     string
}{
	{"strings", `{"traceparent": "00-a-b-01", "x": ""}`, []Header{{Key: "traceparent", Value: "00-a-b-01"}, {Key: "x", Value: ""}}, ""},
	{"null member dropped", `{"traceparent": null, "tracestate": "t=1"}`, []Header{{Key: "tracestate", Value: "t=1"}}, ""},
	{"null object", `null`, nil, ""},
	{"null for a reserved name sets nothing", `{"outbox-origin": null}`, nil, ""},
	{"number", `{"n": 1}`, nil, `header "n" to a number`},
	{"boolean", `{"b": true}`, nil, `header "b" to a boolean`},
	{"object", `{"o": {"p": "q"}}`, nil, `header "o" to an object`},
	{"array", `{"a": ["x"]}`, nil, `header "a" to an array`},
	{"not an object", `["x"]`, nil, "not a JSON object"},
	{"reserved outbox-id", `{"outbox-id": "999"}`, nil, `"outbox-id", which outboxd sets itself`},
	{"reserved aggregate-id", `{"aggregate-id": "other"}`, nil, `"aggregate-id"`},
	{"reserved outbox-origin", `{"outbox-origin": "forged/1/1"}`, nil, `"outbox-origin"`},
	{"reserved event-type", `{"event-type": "Forged"}`, nil, `"event-type"`},
	{"reserved content-type", `{"content-type": "text/plain"}`, nil, `"content-type"`},
	{"reserved ce_ prefix", `{"ce_id": "1"}`, nil, `"ce_id"`},
	{"reserved dlq- prefix", `{"dlq-error": "x"}`, nil, `"dlq-error"`},
	{"reserved outboxd- prefix", `{"outboxd-error": "x"}`, nil, `"outboxd-error"`},
	{"configured id header", `{"id": "1"}`, nil, `"id"`},
	{"header column's name", `{"eventType": "x"}`, nil, `"eventType"`},
	{"case differs: not reserved", `{"Outbox-Id": "1"}`, []Header{{Key: "Outbox-Id", Value: "1"}}, ""},
}

// headerRuleConfig reserves what a Debezium-style mapping adds: its id
// header "id" and a header column's "eventType".
func headerRuleConfig() DecoderConfig {
	return DecoderConfig{Messages: true, MessageKey: testKey, ReservedHeaders: []string{"id"},
		HeaderColumns: []HeaderColumn{{Column: "event_type_col", Header: "eventType"}}}
}

// TestHeadersRuleTable: a headers column member that is a string is a
// header, a null one none; any other value or a reserved name makes the
// row a bad event (never an event carrying it, never a stream error), in
// a jsonb and in a json column.
func TestHeadersRuleTable(t *testing.T) {
	for _, oid := range []uint32{oidJSONB, oidJSON} {
		for _, tt := range headerRuleCases {
			t.Run(strconv.Itoa(int(oid))+"/"+tt.name, func(t *testing.T) {
				cfg := headerRuleConfig()
				cfg.HeaderColumns = nil // the test table has no such column
				cfg.ReservedHeaders = []string{"id", "eventType"}
				d := NewDecoder(cfg)
				decodeAll(t, d, begin(1), headersRelation(oid))
				m, err := d.Decode(encodeInsert(outboxRel, txt("7"), txt("k"), txt("orders"), txt(`{}`), txt(tt.headers)))
				if err != nil {
					if m, err = asBadEvent(err); err != nil {
						t.Fatalf("stream error %v, want an event or a bad event", err)
					}
				}
				checkHeaderRule(t, m, tt.want, tt.bad)
				if m.Kind == KindBad && (m.Bad.ID != "7" || m.Bad.Table != "public.outbox") {
					t.Errorf("bad event %+v, want id 7 of public.outbox", m.Bad)
				}
			})
		}
	}
}

// TestHeadersRuleMessage: the same rule for an authentic outbox_emit
// message; what it refuses is a bad event (dead-letter topic or halt), not
// a rejection: outbox_emit wrote it in a committed transaction.
func TestHeadersRuleMessage(t *testing.T) {
	for _, tt := range headerRuleCases {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(headerRuleConfig())
			const lsn = 0x2010
			msgs := decodeAll(t, d, begin(1), encodeMessage(true, lsn, MessagePrefix, emitContent("orders", "k", tt.headers, `{}`)), commit())
			checkHeaderRule(t, msgs[1], tt.want, tt.bad)
			if m := msgs[1]; m.Kind == KindBad {
				if m.Bad.ID != strconv.Itoa(lsn) || len(m.Bad.Columns) != 4 || string(m.Bad.Columns[2].Value) != tt.headers {
					t.Errorf("bad event %+v, want id %d and the message's fields", m.Bad, lsn)
				}
			}
		})
	}
}

// TestAuthenticUnparsableMessageIsBad: a message whose MAC verifies but
// whose fields do not parse is a bad event carrying its content, never a
// rejection (that would drop a committed event as a forgery).
func TestAuthenticUnparsableMessageIsBad(t *testing.T) {
	d := keyedDecoder()
	content := signed(testKey.Key, "99:t")
	msgs := decodeAll(t, d, begin(1), encodeMessage(true, 0x2010, MessagePrefix, content), commit())
	m := msgs[1]
	if m.Kind != KindBad {
		t.Fatalf("Kind %v (%+v), want bad", m.Kind, m.Rejected)
	}
	if m.Bad.ID != strconv.Itoa(0x2010) || len(m.Bad.Columns) != 1 || string(m.Bad.Columns[0].Value) != "99:t" ||
		!strings.Contains(m.Bad.Reason, "do not parse") {
		t.Fatalf("bad event %+v", m.Bad)
	}
}

func checkHeaderRule(t *testing.T, m Message, want []Header, bad string) {
	t.Helper()
	if bad != "" {
		if m.Kind != KindBad || !strings.Contains(m.Bad.Reason, bad) {
			t.Fatalf("Kind %v, bad event %+v (rejected %+v), want a bad event saying %q", m.Kind, m.Bad, m.Rejected, bad)
		}
		return
	}
	if m.Kind != KindEvent {
		t.Fatalf("Kind %v (bad %q, rejected %+v), want an event", m.Kind, m.Bad.Reason, m.Rejected)
	}
	if len(m.Event.Headers) != len(want) {
		t.Fatalf("headers %q, want %q", m.Event.Headers, want)
	}
	for i := range want {
		if m.Event.Headers[i] != want[i] {
			t.Fatalf("headers %q, want %q", m.Event.Headers, want)
		}
	}
}

// TestHeaderColumnReservedNameRefused: a header column may not take one of
// outboxd's names, nor the mapping's.
func TestHeaderColumnReservedNameRefused(t *testing.T) {
	for _, h := range []string{"outbox-id", "outbox-origin", "ce_type", "id"} {
		cfg := DecoderConfig{ReservedHeaders: []string{"id"}, HeaderColumns: []HeaderColumn{{Column: "c", Header: h}}}
		if err := cfg.Validate(); err == nil {
			t.Errorf("header column c=%s: Validate() = nil, want an error", h)
		}
	}
}

// TestRecordCarriesReservedHeadersOnce: whatever headers a row or an
// outbox_emit message asks for, the record it becomes (outbox.NewRecord,
// the origin header the delivery mode adds, the CloudEvents binary
// encoder's attributes) carries each header outboxd sets exactly once, with
// outboxd's value; an event asking for one is a bad event instead.
func TestRecordCarriesReservedHeadersOnce(t *testing.T) {
	enc, err := format.NewEncoder(format.Config{CloudEvents: format.Binary, Source: "/s", TypeHeader: outbox.HeaderEventType}, nil, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mapping := outbox.DefaultMapping()
	const origin = "sys/db/1"
	reserved := []string{outbox.HeaderOutboxID, outbox.HeaderAggregateID, outbox.HeaderEventType, outbox.HeaderOrigin,
		"content-type", "ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time"}
	for _, name := range append(reserved, "traceparent") {
		headers := fmt.Sprintf(`{%q: "writer's", "tracestate": "t=1"}`, name)
		d := NewDecoder(DecoderConfig{Messages: true, MessageKey: testKey})
		msgs := decodeAll(t, d, begin(1), outboxRelation(), encodeMessage(true, 0x2010, MessagePrefix, emitContent("orders", "k", headers, `{}`)))
		rowRel := encodeRelation(outboxRel+1, "public", "outbox",
			column{"id", oidInt8}, column{"aggregate_id", oidText}, column{"topic", oidText}, column{"payload", oidJSONB},
			column{"event_type", oidText}, column{"headers", oidJSONB})
		if _, err := d.Decode(rowRel); err != nil {
			t.Fatal(err)
		}
		row, err := d.Decode(encodeInsert(outboxRel+1, txt("7"), txt("k"), txt("orders"), txt(`{}`), txt("OrderCreated"), txt(headers)))
		if err != nil {
			if row, err = asBadEvent(err); err != nil {
				t.Fatal(err)
			}
		}
		for what, m := range map[string]Message{"message": msgs[2], "row": row} {
			if slices.Contains(reserved, name) {
				if m.Kind != KindBad {
					t.Errorf("%s setting %s: Kind %v, want a bad event", what, name, m.Kind)
				}
				continue
			}
			if m.Kind != KindEvent {
				t.Fatalf("%s setting %s: Kind %v (%s), want an event", what, name, m.Kind, m.Bad.Reason)
			}
			r := outbox.NewRecord(&m.Event, &mapping, commitTime)
			r.Headers = append(r.Headers, kafka.Header{Key: outbox.HeaderOrigin, Value: []byte(origin)})
			if err := enc.Encode(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			count := map[string]int{}
			for _, h := range r.Headers {
				count[h.Key]++
				if slices.Contains(reserved, h.Key) && string(h.Value) == "writer's" {
					t.Errorf("%s setting %s: header %s has the writer's value", what, name, h.Key)
				}
			}
			for _, h := range reserved {
				want := 1
				if h == outbox.HeaderEventType && what == "message" {
					want = 0 // outbox_emit has no event type
				}
				if count[h] != want {
					t.Errorf("%s setting %s: header %s occurs %d times, want %d: %q", what, name, h, count[h], want, r.Headers)
				}
			}
		}
	}
}
