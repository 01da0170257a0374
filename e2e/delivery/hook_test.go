package delivery

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// hookEnv has a hook_orders table and a hook that marks an order sent once its
// event is in Kafka. The hook fails while hook_block has a row.
func hookEnv(t *testing.T) (*e2e.Env, string) {
	e := e2e.NewEnv(t, 1)
	e.Exec(`CREATE TABLE hook_orders (id bigint primary key, status text not null)`)
	e.Exec(`CREATE TABLE hook_block (reason text)`)
	e.Exec(`CREATE FUNCTION mark_sent(agg text) RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT 1 FROM hook_block) THEN RAISE EXCEPTION 'hook blocked'; END IF;
			UPDATE hook_orders SET status = 'sent_to_establishment' WHERE 'order-' || id = agg;
		END $$`)
	return e, e.Topic + "=SELECT mark_sent($1)"
}

func hookStatus(e *e2e.Env, id int) string {
	e.T.Helper()
	c := e.Conn()
	defer c.Close(context.Background())
	var s string
	if err := c.QueryRow(context.Background(), `SELECT status FROM hook_orders WHERE id = $1`, id).Scan(&s); err != nil {
		e.T.Fatal(err)
	}
	return s
}

func hookOrder(e *e2e.Env, id int, topic string) {
	e.T.Helper()
	e.Exec(`WITH o AS (INSERT INTO hook_orders VALUES ($1, 'created') RETURNING id)
		INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'order-' || id, $2, '{"status": "created"}' FROM o`, id, topic)
}

func TestRunHookRunsAfterPublishBeforeConfirm(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)

	t.Run("publish and hook succeed", func(t *testing.T) {
		t.Parallel()
		e, hook := hookEnv(t)
		d := e.Start("--hook", hook)
		hookOrder(e, 1, e.Topic)
		if got := len(k.ReadAll(t, e.Topic, 1, 30*time.Second)); got != 1 {
			t.Fatalf("%d records, want 1", got)
		}
		e2e.WaitFor(t, 30*time.Second, func() bool { return hookStatus(e, 1) == "sent_to_establishment" })
		d.Stop()
		// Confirmed: a restart publishes nothing again.
		d = e.Start("--hook", hook)
		time.Sleep(2 * time.Second)
		if got := len(k.ReadAll(t, e.Topic, 2, 2*time.Second)); got != 1 {
			t.Fatalf("%d records after restart, want 1", got)
		}
		d.Stop()
	})
	t.Run("publish fails: hook does not run", func(t *testing.T) {
		t.Parallel()
		e, hook := hookEnv(t)
		missing := testenv.UniqueName("missing")
		d := e.Start("--hook", hook, "--hook", missing+"=SELECT mark_sent($1)")
		hookOrder(e, 1, missing) // a topic that does not exist: poison, halts
		if code := d.Wait(60 * time.Second); code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		if s := hookStatus(e, 1); s != "created" {
			t.Fatalf("status %q after a failed publish, want created", s)
		}
	})
	t.Run("publish ok, hook fails: retried, never skipped", func(t *testing.T) {
		t.Parallel()
		e, hook := hookEnv(t)
		e.Exec(`INSERT INTO hook_block VALUES ('test')`)
		d := e.Start("--hook", hook)
		hookOrder(e, 1, e.Topic)
		d.WaitLog("post-publish hook failed", 30*time.Second)
		if s := hookStatus(e, 1); s != "created" {
			t.Fatalf("status %q while the hook fails", s)
		}
		e.Exec(`DELETE FROM hook_block`)
		e2e.WaitFor(t, 30*time.Second, func() bool { return hookStatus(e, 1) == "sent_to_establishment" })
		n := len(k.ReadAll(t, e.Topic, 100, 3*time.Second))
		t.Logf("hook failed then succeeded: event published %d times (re-published on each retry)", n)
		if n < 2 {
			t.Fatalf("event published %d times, want ≥ 2 (once per attempt)", n)
		}
		if !strings.Contains(d.Out.String(), `"cause": "hook"`) {
			t.Errorf("restart cause hook not logged")
		}
		d.Stop()
	})
	t.Run("topic without a hook", func(t *testing.T) {
		t.Parallel()
		e, _ := hookEnv(t)
		other := k.Topic(t, "nohook", 1)
		d := e.Start("--hook", other+"-x=SELECT mark_sent($1)")
		hookOrder(e, 1, other)
		if got := len(k.ReadAll(t, other, 1, 30*time.Second)); got != 1 {
			t.Fatalf("%d records, want 1", got)
		}
		time.Sleep(time.Second)
		if s := hookStatus(e, 1); s != "created" {
			t.Fatalf("status %q: a hook ran for a topic without one", s)
		}
		d.Stop()
	})
}
