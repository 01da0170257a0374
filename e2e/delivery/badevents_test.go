package delivery

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// badKinds are outbox rows that cannot become a record, each inserted in a
// transaction of its own followed by a good row in the same transaction.
type badKind struct{ name, insert, reason string }

var badKinds = []badKind{
	{"null payload", `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, NULL)`, `column "payload" is NULL`},
	{"null key", `INSERT INTO outbox (aggregate_id, topic, payload) VALUES (NULL, $1, '{}')`, `column "aggregate_id" is NULL`},
	{"headers not strings", `INSERT INTO outbox (aggregate_id, topic, payload, headers) VALUES ('k', $1, '{}', '{"n": 1}')`, `sets header "n" to a number`},
	{"reserved header", `INSERT INTO outbox (aggregate_id, topic, payload, headers) VALUES ('k', $1, '{}', '{"outbox-origin": "forged"}')`, `sets header "outbox-origin", which outboxd sets itself`},
	{"no topic", `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', nullif($1, $1), '{"no": "topic"}')`, "no topic"},
}

// badEventsTable lets the outbox table hold the bad rows.
func badEventsTable(e *e2e.Env) {
	e.Exec(`ALTER TABLE outbox ALTER aggregate_id DROP NOT NULL, ALTER topic DROP NOT NULL, ALTER payload DROP NOT NULL`)
}

// insertBad writes bad kind i and a good row {"good": i} in one
// transaction.
func insertBad(t *testing.T, e *e2e.Env, c *pgx.Conn, i int) {
	t.Helper()
	insertKind(t, e, c, badKinds, i)
}

func insertKind(t *testing.T, e *e2e.Env, c *pgx.Conn, kinds []badKind, i int) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, kinds[i].insert, e.Topic); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, $2::jsonb)`, e.Topic, fmt.Sprintf(`{"good": %d}`, i))
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", kinds[i].name, err)
	}
}

// distinctValues reads topic until it holds n distinct values (a halt may
// leave its last confirmation unsent, so replays may repeat records) and
// returns them in first-seen order.
func distinctValues(t *testing.T, topic string, n int) string {
	t.Helper()
	for want := n; ; want++ {
		msgs := testenv.Kafka(t).ReadAll(t, topic, want, 30*time.Second)
		seen := map[string]bool{}
		var vs []string
		for _, m := range msgs {
			if !seen[string(m.Value)] {
				seen[string(m.Value)] = true
				vs = append(vs, string(m.Value))
			}
		}
		if len(vs) >= n || len(msgs) < want {
			return strings.Join(vs, " ")
		}
	}
}

func goodValues(n int) string {
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf(`{"good": %d}`, i))
	}
	return strings.Join(want, " ")
}

// TestRunBadEventsDeadLettered: with --dead-letter-topic each kind of bad
// row goes there with its raw columns, LSN, xid, table and reason, and the
// stream goes on: every good row, including those in a bad row's
// transaction, arrives in order.
func TestRunBadEventsDeadLettered(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	badEventsTable(e)
	dlq := testenv.Kafka(t).Topic(t, "dlq", 1)
	d := e.Start("--dead-letter-topic", dlq)
	c := e.Conn()
	defer c.Close(context.Background())
	for i := range badKinds {
		insertBad(t, e, c, i)
	}
	if got := strings.Join(e2e.Values(t, e, e.Topic, len(badKinds)), " "); got != goodValues(len(badKinds)) {
		t.Fatalf("main topic %s, want every good row %s", got, goodValues(len(badKinds)))
	}
	dead := testenv.Kafka(t).ReadAll(t, dlq, len(badKinds), 60*time.Second)
	for i, m := range dead {
		k := badKinds[i]
		// An unroutable event is found after decoding: no table named.
		table := map[bool]string{true: "", false: "public.outbox"}[k.name == "no topic"]
		if !strings.Contains(e2e.Header(m, "dlq-error"), k.reason) || e2e.Header(m, "dlq-source-table") != table ||
			!regexp.MustCompile(`^[0-9A-F]+/[0-9A-F]+$`).MatchString(e2e.Header(m, "dlq-source-lsn")) || e2e.Header(m, "dlq-source-xid") == "" {
			t.Errorf("%s: dead-letter headers %q, want the reason %q, LSN, xid and table", k.name, e2e.HeaderPairs(m), k.reason)
		}
		if !strings.Contains(string(m.Value), `"payload":`) {
			t.Errorf("%s: dead-letter value %s, want the row's raw columns", k.name, m.Value)
		}
	}
	if d.Exited() {
		t.Fatalf("outboxd exited:\n%s", d.Out.String())
	}
	d.Stop()
}

var skipFlags = regexp.MustCompile(`start outboxd again with((?: --skip-bad-event [0-9A-F]+/[0-9A-F]+)+);`)

// TestRunBadEventsHaltAndSkipExactlyOne: without a dead-letter topic each
// kind of bad row halts outboxd with the flag that skips it; restarted with
// that flag, outboxd skips that event only (its transaction's good row
// arrives) and halts again on the next bad row.
func TestRunBadEventsHaltAndSkipExactlyOne(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	badEventsTable(e)
	c := e.Conn()
	defer c.Close(context.Background())
	// Without a dead-letter topic an event over the Kafka size limit is
	// one too.
	kinds := append(slices.Clone(badKinds), badKind{"over the size limit",
		`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, jsonb_build_object('big', repeat('x', 5000)))`,
		"larger than the producer's max message bytes"},
		// An outbox_emit message too large to publish is not even held: the
		// frame filter reads it through its MAC check, and the authentic
		// one halts the same way.
		badKind{"outbox_emit message too large to hold", `SELECT outbox_emit($1, 'k', jsonb_build_object('big', repeat('x', 100000)))`,
			"its content of 100"})
	limit := []string{"--kafka-max-message-bytes", "4096"}
	var skip []string
	for i, k := range kinds {
		d := e.Start(append(slices.Clone(limit), skip...)...)
		if i == 0 { // the slot exists now
			for i := range kinds {
				insertKind(t, e, c, kinds, i)
			}
		}
		if code := d.Wait(60 * time.Second); code == 0 {
			t.Fatalf("%s: outboxd exited 0, want a halt", k.name)
		}
		out := d.Out.String()
		m := skipFlags.FindStringSubmatch(out)
		if m == nil || !strings.Contains(out, k.reason) {
			t.Fatalf("%s: halt without --skip-bad-event and the reason %q:\n%s", k.name, k.reason, out)
		}
		next := strings.Fields(m[1])
		if len(next) != 2*(i+1) {
			t.Fatalf("%s: halted with %q, want the %d earlier skips and this event's", k.name, m[1], i)
		}
		skip = next
		if got := distinctValues(t, e.Topic, i); got != goodValues(i) {
			t.Fatalf("after %d skips: %s, want %s", i, got, goodValues(i))
		}
	}
	d := e.Start(append(limit, skip...)...)
	if got := distinctValues(t, e.Topic, len(kinds)); got != goodValues(len(kinds)) {
		t.Fatalf("after skipping each bad row: %s, want every good row %s", got, goodValues(len(kinds)))
	}
	d.Stop()
}
