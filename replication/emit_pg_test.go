package replication

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/migrations"
)

// emitEnv is a migrated database with a pgoutput slot of its own that
// reads logical decoding messages. Not a temporary slot: PostgreSQL drops
// those at the first error in their session, and the tests make errors on
// purpose (testenv drops the database's slots at cleanup).
type emitEnv struct {
	conn *pgx.Conn
	slot string
	dec  *Decoder
}

func newEmitEnv(t *testing.T) *emitEnv {
	t.Helper()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	conn := pg.Conn(t)
	var major int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
		t.Fatal(err)
	}
	if major < 14 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL %d: pgoutput sends logical decoding messages from 14 on; CI runs 15", major)
		}
		t.Skipf("PostgreSQL %d: pgoutput sends logical decoding messages from 14 on", major)
	}
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		t.Fatal(err)
	}
	var keyHex, installed string
	if err := conn.QueryRow(ctx, `SELECT encode(key, 'hex'), installed_lsn::text FROM outbox_emit_key`).Scan(&keyHex, &installed); err != nil {
		t.Fatal(err)
	}
	k := &MessageKey{}
	var err error
	if k.Key, err = hex.DecodeString(keyHex); err != nil {
		t.Fatal(err)
	}
	if k.InstalledLSN, err = pglogrepl.ParseLSN(installed); err != nil {
		t.Fatal(err)
	}
	// Slot names are the cluster's: take the database's, which is unique.
	slot := strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(pg.Database))
	slot = slot[:min(len(slot), 63)]
	if _, err := conn.Exec(ctx, `CREATE PUBLICATION emit_test`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	return &emitEnv{conn: conn, slot: slot, dec: NewDecoder(DecoderConfig{Messages: true, MessageKey: k})}
}

// emit calls the real outbox_emit in a transaction of its own, committed
// when the call succeeds.
func (e *emitEnv) emit(t *testing.T, topic *string, key string, payload string, headers *string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = tx.Exec(ctx, `SELECT outbox_emit($1, $2, $3::jsonb, $4::jsonb)`, topic, key, payload, headers); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return nil
}

// decoded decodes what the slot holds since the last call, as the stream
// would: every message the decoder returns other than Begin, Commit and
// KindNone.
func (e *emitEnv) decoded(t *testing.T) []Message {
	t.Helper()
	rows, err := e.conn.Query(context.Background(), `SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'emit_test', 'messages', 'true')`, e.slot)
	if err != nil {
		t.Fatal(err)
	}
	datas, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	var out []Message
	for _, d := range datas {
		m, err := e.dec.Decode(d)
		if err != nil {
			if m, err = asBadEvent(err); err != nil {
				t.Fatalf("decode %q: %v", d, err)
			}
		}
		switch m.Kind {
		case KindNone, KindBegin, KindCommit:
			continue
		}
		out = append(out, m)
	}
	return out
}

func ptr(s string) *string { return &s }

// TestOutboxEmitHeadersRule: the real outbox_emit refuses, naming the
// header, a header whose value is not a string and a header outboxd sets
// itself, so the writer's statement fails and nothing is committed; a null
// header is accepted and the event decodes without it.
func TestOutboxEmitHeadersRule(t *testing.T) {
	e := newEmitEnv(t)
	for _, tt := range []struct {
		name, headers, refused string
	}{
		{"number", `{"n": 1}`, `header "n" is a JSON number`},
		{"object", `{"o": {"p": "q"}}`, `header "o" is a JSON object`},
		{"boolean", `{"traceparent": true}`, `header "traceparent" is a JSON boolean`},
		{"reserved outbox-id", `{"outbox-id": "1"}`, `header "outbox-id" is one outboxd sets itself`},
		{"reserved aggregate-id", `{"aggregate-id": "x"}`, `header "aggregate-id"`},
		{"reserved event-type", `{"event-type": "x"}`, `header "event-type"`},
		{"reserved outbox-origin", `{"outbox-origin": "x"}`, `header "outbox-origin"`},
		{"reserved content-type", `{"content-type": "x"}`, `header "content-type"`},
		{"reserved ce_", `{"ce_id": "x"}`, `header "ce_id"`},
		{"reserved dlq-", `{"dlq-error": "x"}`, `header "dlq-error"`},
		{"reserved outboxd-", `{"outboxd-error": "x"}`, `header "outboxd-error"`},
		{"not an object", `["x"]`, `headers must be a JSON object`},
	} {
		err := e.emit(t, ptr("orders"), "k", `{}`, &tt.headers)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, tt.refused) {
			t.Errorf("%s: outbox_emit(..., %s) = %v, want SQLSTATE 22023 saying %q", tt.name, tt.headers, err, tt.refused)
		}
	}
	if ms := e.decoded(t); len(ms) != 0 {
		t.Fatalf("refused calls left %d messages in WAL: %+v", len(ms), ms)
	}

	// Null, as jsonb_build_object writes an absent trace context.
	ctx := context.Background()
	if _, err := e.conn.Exec(ctx, `SELECT outbox_emit('orders', 'k', '{"a": 1}', jsonb_build_object('traceparent', NULL::text, 'tracestate', 't=1'))`); err != nil {
		t.Fatalf("null header: %v", err)
	}
	if _, err := e.conn.Exec(ctx, `SELECT outbox_emit('orders', 'k', '{}', jsonb_build_object('outbox-origin', NULL::text))`); err != nil {
		t.Fatalf("null reserved header: %v", err)
	}
	ms := e.decoded(t)
	if len(ms) != 2 {
		t.Fatalf("decoded %d messages, want 2: %+v", len(ms), ms)
	}
	for i, want := range [][]Header{{{Key: "tracestate", Value: "t=1"}}, nil} {
		m := ms[i]
		if m.Kind != KindEvent {
			t.Fatalf("message %d: Kind %v (bad %q, rejected %+v), want an event", i, m.Kind, m.Bad.Reason, m.Rejected)
		}
		if fmt.Sprint(m.Event.Headers) != fmt.Sprint(want) {
			t.Errorf("message %d: headers %q, want %q", i, m.Event.Headers, want)
		}
	}
}

// TestOutboxEmitRoundTripProperty drives random topics, keys, payloads and
// headers (unicode, empty, nested, null, reserved names) through the real
// outbox_emit: each call either fails, exactly when a header breaks the
// rule, or decodes to an event whose topic, key, payload (the jsonb's text)
// and headers (its string members, in jsonb's order) are byte-exact.
func TestOutboxEmitRoundTripProperty(t *testing.T) {
	e := newEmitEnv(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	const n = 150
	type call struct {
		topic, key, payload string // payload: the jsonb's text
		headers             []Header
	}
	var want []call
	for i := range n {
		var topic *string
		if rng.IntN(5) > 0 {
			topic = ptr(randText(rng))
		}
		key := randText(rng)
		payload := randJSON(rng, 3)
		var headers *string
		breaks := false
		if rng.IntN(6) > 0 {
			h, b := randHeaders(rng)
			headers, breaks = &h, b
		}
		err := e.emit(t, topic, key, payload, headers)
		if breaks {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "22023" {
				t.Fatalf("call %d: outbox_emit(%q, %q, %s, %s) = %v, want SQLSTATE 22023", i, deref(topic), key, payload, deref(headers), err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("call %d: outbox_emit(%q, %q, %s, %s): %v", i, deref(topic), key, payload, deref(headers), err)
		}
		c := call{key: key} // a NULL topic is none: --default-topic applies
		if topic != nil {
			c.topic = *topic
		}
		if err := e.conn.QueryRow(ctx, `SELECT $1::jsonb::text`, payload).Scan(&c.payload); err != nil {
			t.Fatal(err)
		}
		if headers != nil {
			rows, err := e.conn.Query(ctx, `SELECT key, value #>> '{}' FROM jsonb_each($1::jsonb) WHERE jsonb_typeof(value) = 'string'`, *headers)
			if err != nil {
				t.Fatal(err)
			}
			if c.headers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Header, error) {
				var h Header
				return h, r.Scan(&h.Key, &h.Value)
			}); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, c)
	}
	t.Logf("%d calls, %d refused", n, n-len(want))
	ms := e.decoded(t)
	if len(ms) != len(want) {
		t.Fatalf("decoded %d messages, want %d", len(ms), len(want))
	}
	for i, m := range ms {
		w := want[i]
		if m.Kind != KindEvent {
			t.Fatalf("message %d: Kind %v (bad %q, rejected %+v), want an event of %+v", i, m.Kind, m.Bad.Reason, m.Rejected, w)
		}
		ev := m.Event
		if ev.Topic != w.topic || ev.AggregateID != w.key || string(ev.Payload) != w.payload || fmt.Sprintf("%q", ev.Headers) != fmt.Sprintf("%q", w.headers) {
			t.Fatalf("message %d: decoded topic %q key %q payload %s headers %q; want %q %q %s %q",
				i, ev.Topic, ev.AggregateID, ev.Payload, ev.Headers, w.topic, w.key, w.payload, w.headers)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}

// randText is a short string of ASCII, separators, escapes and non-ASCII
// runes, possibly empty; never NUL, which neither text nor jsonb holds.
func randText(rng *rand.Rand) string {
	alphabet := []rune("ab:01 \"\\\n\t{}[]é€😀\u200b\u07ff")
	var b strings.Builder
	for range rng.IntN(8) {
		b.WriteRune(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

// randJSON is the text of a random JSON value, nested to depth at most.
func randJSON(rng *rand.Rand, depth int) string {
	k := rng.IntN(7)
	if depth == 0 {
		k = rng.IntN(4)
	}
	switch k {
	case 0:
		return "null"
	case 1:
		return strconv.FormatBool(rng.IntN(2) == 0)
	case 2:
		return strconv.FormatFloat(rng.NormFloat64()*1e6, 'g', -1, 64)
	case 3, 4:
		s, _ := json.Marshal(randText(rng))
		return string(s)
	case 5:
		parts := make([]string, rng.IntN(4))
		for i := range parts {
			parts[i] = randJSON(rng, depth-1)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	parts := make([]string, rng.IntN(4))
	for i := range parts {
		k, _ := json.Marshal(randText(rng))
		parts[i] = string(k) + ":" + randJSON(rng, depth-1)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// randHeaders is a random headers object and whether it breaks the rule:
// a member neither a string nor null, or a reserved name with a string.
func randHeaders(rng *rand.Rand) (string, bool) {
	names := []string{"traceparent", "tracestate", "", "é", "x:y", "outbox-id", "outbox-origin", "ce_type", "dlq-x", "Outbox-Id"}
	seen := map[string]bool{}
	var parts []string
	breaks := false
	for range rng.IntN(4) {
		name := names[rng.IntN(len(names))]
		if rng.IntN(3) == 0 {
			name = randText(rng)
		}
		if seen[name] {
			continue // jsonb keeps the last of a repeated key: keep the prediction simple
		}
		seen[name] = true
		var v string
		switch rng.IntN(4) {
		case 0:
			v = "null"
		case 1:
			v = randJSON(rng, 2)
		default:
			s, _ := json.Marshal(randText(rng))
			v = string(s)
		}
		isString, isNull := strings.HasPrefix(v, `"`), v == "null"
		breaks = breaks || !isString && !isNull || isString && reservedByOutboxd(name)
		k, _ := json.Marshal(name)
		parts = append(parts, string(k)+":"+v)
	}
	return "{" + strings.Join(parts, ",") + "}", breaks
}

// reservedByOutboxd is the decoder's rule with no configured names.
func reservedByOutboxd(name string) bool { return NewDecoder(DecoderConfig{}).reserved(name) }
