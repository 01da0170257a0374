package outbox

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"
)

func headerList(t *testing.T, m *Mapping, ev *Event) string {
	t.Helper()
	r := NewRecord(ev, m, time.Time{})
	var s string
	for _, h := range r.Headers {
		s += fmt.Sprintf("%s=%s;", h.Key, h.Value)
	}
	return s
}

func TestNewRecordHeaders(t *testing.T) {
	ev := &Event{ID: 42, AggregateID: "order-1", EventType: "Created",
		Headers: []Header{{Key: "traceparent", Value: "00-abc-def-01"}}}
	if got, want := headerList(t, &Mapping{}, ev), "outbox-id=42;aggregate-id=order-1;event-type=Created;traceparent=00-abc-def-01;"; got != want {
		t.Errorf("default mapping: headers %s, want %s", got, want)
	}
	uuid := &Event{UUID: "4d47e190-0402-4048-bc2c-89dd54343cdc", AggregateID: "1"}
	if got, want := headerList(t, &Mapping{IDHeader: "id", KeyHeader: "-"}, uuid), "id=4d47e190-0402-4048-bc2c-89dd54343cdc;"; got != want {
		t.Errorf("debezium headers: %s, want %s", got, want)
	}
}

func TestNewRecordJSONStringEncoding(t *testing.T) {
	ev := &Event{ID: 1, AggregateID: "1", Payload: []byte(`{"id": 1, "s": "a\"b", "t": "x</y>"}`)}
	r := NewRecord(ev, &Mapping{KeyEncoding: JSONString, ValueEncoding: JSONString}, time.Time{})
	if got, want := string(r.Key), `"1"`; got != want {
		t.Errorf("key %s, want %s", got, want)
	}
	// As Kafka Connect's JsonConverter writes the string: quotes and
	// backslashes escaped, '<' and '>' not.
	if got, want := string(r.Value), `"{\"id\": 1, \"s\": \"a\\\"b\", \"t\": \"x</y>\"}"`; got != want {
		t.Errorf("value %s, want %s", got, want)
	}
	var back string
	if err := json.Unmarshal(r.Value, &back); err != nil || back != string(ev.Payload) {
		t.Errorf("value decodes to %q (%v), want the payload", back, err)
	}
}

func TestAppendJSONStringMatchesJackson(t *testing.T) {
	for in, want := range map[string]string{
		"":              `""`,
		"a\x01\x1fb":    `"a\u0001\u001Fb"`,
		"\b\t\n\f\r":    `"\b\t\n\f\r"`,
		"é\u2028€":      "\"é\u2028€\"",
		"bad\xffutf8":   "\"bad\uFFFDutf8\"",
		`back\slash"q"`: `"back\\slash\"q\""`,
	} {
		if got := string(appendJSONString(nil, []byte(in))); got != want {
			t.Errorf("appendJSONString(%q) = %s, want %s", in, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	f.Add([]byte(`{"a": "b"}`))
	f.Add([]byte("\x00\xff\u2028"))
	f.Fuzz(func(t *testing.T, s []byte) {
		var back string
		if err := json.Unmarshal(appendJSONString(nil, s), &back); err != nil {
			t.Fatalf("appendJSONString(%q) is not a JSON string: %v", s, err)
		}
		if want := string([]rune(string(s))); back != want {
			t.Fatalf("appendJSONString(%q) decodes to %q, want %q", s, back, want)
		}
	})
}

func TestMappingValidate(t *testing.T) {
	if err := (Mapping{KeyEncoding: "base64"}).Validate(); err == nil {
		t.Error("unknown key encoding: Validate() = nil")
	}
	if err := DefaultMapping().Validate(); err != nil {
		t.Error(err)
	}
}

func TestRecordNilPayloadIsNullValue(t *testing.T) {
	m := DefaultMapping()
	m.ValueEncoding = JSONString
	r := NewRecord(&Event{ID: 1, AggregateID: "k", Topic: "t"}, &m, time.Now())
	if r.Value != nil {
		t.Fatalf("value %q, want nil (a tombstone)", r.Value)
	}
}

func TestReservedHeaders(t *testing.T) {
	for name, want := range map[string]bool{
		"outbox-id": true, "aggregate-id": true, "event-type": true, "outbox-origin": true, "content-type": true,
		"ce_id": true, "ce_anything": true, "dlq-error": true, "outboxd-error": true,
		"traceparent": false, "Outbox-Id": false, "id": false, "ce": false, "-": false, "": false,
	} {
		if got := ReservedHeader(name); got != want {
			t.Errorf("ReservedHeader(%q) = %v, want %v", name, got, want)
		}
	}
	deb := DefaultMapping()
	deb.IDHeader, deb.KeyHeader = "id", "-"
	if got := deb.OwnHeaders(); len(got) != 1 || got[0] != "id" {
		t.Errorf("OwnHeaders of id/-: %q, want [id]", got)
	}
	for _, tt := range []struct {
		m    Mapping
		hs   []Header
		want string
	}{
		{DefaultMapping(), []Header{{Key: "traceparent"}, {Key: "outbox-origin"}}, "outbox-origin"},
		{DefaultMapping(), []Header{{Key: "id"}, {Key: "-"}}, ""},
		{deb, []Header{{Key: "-"}, {Key: "id"}}, "id"},
		{deb, []Header{{Key: "aggregate-id"}}, "aggregate-id"},
	} {
		if got, _ := tt.m.ReservedIn(tt.hs); got != tt.want {
			t.Errorf("ReservedIn(%v) with %s/%s = %q, want %q", tt.hs, tt.m.IDHeader, tt.m.KeyHeader, got, tt.want)
		}
	}
}

// TestReservedHeadersMatchOutboxEmit: outbox_emit (migration 008) refuses
// exactly the names ReservedHeader reserves; the SQL holds its own copy of
// the list, so a name added on one side only fails here.
func TestReservedHeadersMatchOutboxEmit(t *testing.T) {
	sql, err := os.ReadFile("../migrations/008_outbox_emit_headers.sql")
	if err != nil {
		t.Fatal(err)
	}
	in := regexp.MustCompile(`m\.key IN \(([^)]*)\)`).FindSubmatch(sql)
	if in == nil {
		t.Fatal("no IN list of reserved names in migration 008")
	}
	var names []string
	for _, q := range regexp.MustCompile(`'([^']*)'`).FindAllSubmatch(in[1], -1) {
		names = append(names, string(q[1]))
	}
	var prefixes []string
	for _, m := range regexp.MustCompile(`left\(m\.key, (\d+)\) = '([^']*)'`).FindAllSubmatch(sql, -1) {
		if n, _ := strconv.Atoi(string(m[1])); n != len(m[2]) {
			t.Errorf("left(m.key, %s) compared with %q of %d bytes", m[1], m[2], len(m[2]))
		}
		prefixes = append(prefixes, string(m[2]))
	}
	if !slices.Equal(names, reservedHeaders) || !slices.Equal(prefixes, reservedHeaderPrefixes) {
		t.Fatalf("migration 008 reserves %q and prefixes %q; ReservedHeader %q and %q", names, prefixes, reservedHeaders, reservedHeaderPrefixes)
	}
}
