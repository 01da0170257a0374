package operations

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// TestRunSourcePollPublishesEveryEventOnceInPerKeyOrder is the clean-run
// e2e test for --source=poll: the real binary, real PostgreSQL and Kafka.
func TestRunSourcePollPublishesEveryEventOnceInPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 6)
	e2e.MigrateForPoll(t, e.DSN)
	e.Exec(`CREATE TABLE hooked (id bigint PRIMARY KEY)`)
	d := e2e.StartDaemon(t, e.Args("--source=poll", "--poll-interval=20ms", "--poll-batch-size=200",
		"--hook", e.Topic+"=INSERT INTO hooked (id) SELECT $2::bigint WHERE $1::text IS NOT NULL ON CONFLICT DO NOTHING")...)
	d.WaitLog("polling", 60*time.Second)
	if err := e.Write(context.Background(), e2e.Load{Writers: 4, Aggregates: 200, Total: 5000, MaxTxn: 100}); err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(2 * time.Minute)
	t.Logf("--source=poll, 5000 events: %s", v)
	if v != (e2e.Verdict{}) {
		t.Fatalf("clean run: %s, want all zero", v)
	}
	d.Stop()
	c := e.Conn()
	defer c.Close(context.Background())
	var unpublished int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if unpublished != 0 {
		t.Fatalf("%d rows not marked published after a clean stop", unpublished)
	}
	var hooked int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM hooked`).Scan(&hooked); err != nil {
		t.Fatal(err)
	}
	if hooked != n {
		t.Fatalf("the post-publish hook ran for %d rows, want %d", hooked, n)
	}
}

func TestRunSourcePollErrors(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	brokers := strings.Join(k.Brokers, ",")
	t.Run("unknown source", func(t *testing.T) {
		t.Parallel()
		e2e.ExpectExit(t, `invalid configuration: --source "wal": use cdc, messages or poll`,
			"run", "--pg-dsn", "postgres://localhost/x", "--kafka-brokers", brokers, "--source", "wal")
	})
	t.Run("not migrated", func(t *testing.T) {
		t.Parallel()
		pg := testenv.Postgres(t)
		pg.Exec(t, `CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, topic text NOT NULL, payload jsonb NOT NULL)`)
		e2e.ExpectExit(t, `outbox table public.outbox has no column "published_at": run "outboxd migrate --source=poll" (poll.Migrate adds it)`,
			"run", "--pg-dsn", pg.DSN, "--kafka-brokers", brokers, "--source", "poll")
	})
	t.Run("migrate unknown source", func(t *testing.T) {
		t.Parallel()
		e2e.ExpectExit(t, `invalid configuration: --source "wal": use cdc, messages or poll`,
			"migrate", "--pg-dsn", "postgres://localhost/x", "--source", "wal")
	})
}
