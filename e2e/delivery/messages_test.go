package delivery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// The table-less outbox: events written by outbox_emit (migration 006) as
// logical decoding messages. The tests record each emitted event's LSN,
// which outboxd sends as its outbox-id, in a table of their own, in the same
// transaction: committed events are then exactly the rows of that table,
// and verify() checks them as it checks the outbox table's.

const emittedDDL = `CREATE TABLE IF NOT EXISTS emitted (lsn pg_lsn PRIMARY KEY, agg text NOT NULL, payload text NOT NULL, topic text NOT NULL)`

// emit writes one event through outbox_emit and records it in emitted.
func emit(ctx context.Context, tx pgx.Tx, topic, agg, payload string) error {
	_, err := tx.Exec(ctx, `INSERT INTO emitted (lsn, agg, payload, topic)
		SELECT outbox_emit($1, $2, $3::jsonb), $2, $3::jsonb::text, $1`, topic, agg, payload)
	return err
}

// emittedRows are the committed events, keyed by outbox-id (the LSN).
func emittedRows(e *e2e.Env) map[int64]e2e.Row {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	rs, err := c.Query(context.Background(), `SELECT (lsn - '0/0'::pg_lsn)::bigint, agg, payload, topic FROM emitted`)
	if err != nil {
		e.T.Fatal(err)
	}
	out := map[int64]e2e.Row{}
	var id int64
	var r e2e.Row
	if _, err := pgx.ForEachRow(rs, []any{&id, &r.Agg, &r.Payload, &r.Topic}, func() error {
		out[id] = r
		return nil
	}); err != nil {
		e.T.Fatal(err)
	}
	return out
}

func emittedDelivered(e *e2e.Env, timeout time.Duration) (e2e.Verdict, int) {
	e.T.Helper()
	want := emittedRows(e)
	return e2e.Verify(e.T, want, e2e.Consume(e.T, e.Brokers, e.Topic, want, timeout)), len(want)
}

// emitWriter emits n events in transactions of 1..maxTxn, over aggregates
// of its own (so per key, commit order is LSN order).
func emitWriter(e *e2e.Env, ctx context.Context, w, n int, l e2e.Load) error {
	conn, err := pgx.Connect(ctx, e.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	for seq := 0; seq < n; {
		size := min(1+rng.IntN(l.MaxTxn), n-seq)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for i := range size {
				agg := fmt.Sprintf("agg-%d", w+l.Writers*rng.IntN(max(1, l.Aggregates/l.Writers)))
				if err := emit(ctx, tx, e.Topic, agg, fmt.Sprintf(`{"writer": %d, "seq": %d}`, w, seq+i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("emit writer %d: %w", w, err)
		}
		seq += size
		if l.Pause > 0 {
			time.Sleep(l.Pause)
		}
	}
	return nil
}

// TestRunTablelessOutbox: with --source=messages and no outbox table in
// use, what outbox_emit writes in a committed transaction is published,
// with its headers (a null one is none: the event is published without it,
// never skipped as a forgery); a rolled-back transaction and a rolled-back
// savepoint publish nothing.
func TestRunTablelessOutbox(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	e.Exec(emittedDDL)
	d := e.Start("--source", "messages")
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	var traced int64
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if err := emit(ctx, tx, e.Topic, "order-1", `{"n": 1}`); err != nil {
			return err
		}
		// One with headers, not recorded in emitted: checked below.
		return tx.QueryRow(ctx, `SELECT (outbox_emit($1, 'order-1', '{"n": 2}', jsonb_build_object('traceparent', $2::text)) - '0/0'::pg_lsn)::bigint`,
			e.Topic, tp).Scan(&traced)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Rolled back: nothing.
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT outbox_emit($1, 'order-1', '{"rolled": "back"}')`, e.Topic); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A savepoint rolled back, one released.
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SAVEPOINT a; SELECT outbox_emit('`+e.Topic+`', 'order-1', '{"savepoint": "rolled back"}'); ROLLBACK TO SAVEPOINT a`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SAVEPOINT b`); err != nil {
			return err
		}
		if err := emit(ctx, tx, e.Topic, "order-1", `{"n": 3}`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `RELEASE SAVEPOINT b`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A trace header without a trace context at hand.
	if _, err := c.Exec(ctx, `SELECT outbox_emit($1, 'order-1', '{"n": 4}', jsonb_build_object('traceparent', NULL::text))`, e.Topic); err != nil {
		t.Fatal(err)
	}
	want := emittedRows(e)
	got := e2e.Consume(t, e.Brokers, e.Topic, map[int64]e2e.Row{0: {}, 1: {}, 2: {}, 3: {}}, 60*time.Second)
	d.Stop()
	if len(got) != 4 {
		var vs []string
		for _, m := range got {
			vs = append(vs, string(m.Value))
		}
		t.Fatalf("%d records %q, want the 4 committed events (n 1, 2, 3, 4), nothing rolled back", len(got), vs)
	}
	for _, h := range got[3].Headers {
		if string(h.Key) == "traceparent" {
			t.Errorf("event with a null traceparent: headers %q, want none named traceparent", e2e.HeaderPairs(got[3]))
		}
	}
	for i, m := range got {
		if want := fmt.Sprintf(`{"n": %d}`, i+1); string(m.Value) != want || string(m.Key) != "order-1" {
			t.Errorf("record %d: key %q value %s, want order-1 %s in commit order", i, m.Key, m.Value, want)
		}
	}
	if h := e2e.Header(got[1], "traceparent"); h != tp || e2e.Header(got[1], "outbox-id") != fmt.Sprint(traced) {
		t.Errorf("traced event: headers %q, want traceparent %s and outbox-id %d (its LSN)", e2e.HeaderPairs(got[1]), tp, traced)
	}
	for _, m := range []int{0, 2} {
		id := e2e.Header(got[m], "outbox-id")
		var found bool
		for lsn := range want {
			found = found || fmt.Sprint(lsn) == id
		}
		if !found {
			t.Errorf("record %d: outbox-id %s is not the LSN outbox_emit returned", m, id)
		}
	}
	t.Logf("record: topic %s key %s headers %q value %s", got[1].Topic, got[1].Key, e2e.HeaderPairs(got[1]), got[1].Value)
}

// TestRunTablelessKill9LosesNothing: outbox_emit under load, outboxd killed
// with SIGKILL three times: every committed event arrives, per key in commit
// order.
func TestRunTablelessKill9LosesNothing(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	e.Exec(emittedDDL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writeDone := make(chan error, 1)
	l := e2e.Load{Writers: 2, Aggregates: 40, Total: 3000, MaxTxn: 20, Pause: 3 * time.Millisecond}
	for i := 0; i < 3; i++ {
		d := e.Start("--source", "messages")
		if i == 0 {
			go func() {
				errs := make(chan error, l.Writers)
				for w := range l.Writers {
					go func() { errs <- emitWriter(e, ctx, w, l.Total/l.Writers, l) }()
				}
				var err error
				for range l.Writers {
					if werr := <-errs; werr != nil {
						err = werr
					}
				}
				writeDone <- err
			}()
		}
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		d.Kill9()
	}
	d := e.Start("--source", "messages")
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	v, n := emittedDelivered(e, 2*time.Minute)
	t.Logf("outbox_emit, kill -9 three times mid-stream, %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != l.Total {
		t.Fatalf("%d events emitted, %s; want %d, nothing lost, reordered or corrupt", n, v, l.Total)
	}
	d.Stop()
}

// TestRunTableAndMessagesInOneStream: under --source=cdc the table's rows
// and outbox_emit's messages are one stream, in commit order per key.
func TestRunTableAndMessagesInOneStream(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	d := e.Start()
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	for i := range 20 {
		var q string
		if i%2 == 0 {
			q = `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('k', $1, $2::jsonb)`
		} else {
			q = `SELECT outbox_emit($1, 'k', $2::jsonb)`
		}
		if _, err := c.Exec(ctx, q, e.Topic, fmt.Sprintf(`{"i": %d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	got := testenv.Kafka(t).ReadAll(t, e.Topic, 20, 60*time.Second)
	d.Stop()
	var vs []string
	for _, m := range got {
		vs = append(vs, string(m.Value))
	}
	var want []string
	for i := range 20 {
		want = append(want, fmt.Sprintf(`{"i": %d}`, i))
	}
	if strings.Join(vs, " ") != strings.Join(want, " ") {
		t.Fatalf("values %q, want rows and messages interleaved in commit order %q", vs, want)
	}
}

// TestRunTablelessIdleWAL: with nothing emitted and the rest of the
// database busy, the slot's confirmed position keeps up with the server's
// WAL (no WAL piles up behind an idle table-less outbox).
func TestRunTablelessIdleWAL(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	e.Exec(`CREATE TABLE busy (id bigserial PRIMARY KEY, v text)`)
	d := e.Start("--source", "messages")
	c := e.Conn()
	defer c.Close(context.Background())
	ctx := context.Background()
	for range 200 {
		if _, err := c.Exec(ctx, `INSERT INTO busy (v) VALUES (repeat('x', 1000))`); err != nil {
			t.Fatal(err)
		}
	}
	e.WaitConfirmed(30 * time.Second)
	d.Stop()
}
