package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
)

// Helpers more than one theme of tests uses.

// HeaderPairs lists a message's headers as key=value.
func HeaderPairs(m *sarama.ConsumerMessage) []string {
	var hs []string
	for _, h := range m.Headers {
		hs = append(hs, string(h.Key)+"="+string(h.Value))
	}
	return hs
}

// ExpectExit runs outboxd to completion and asserts exit code 1 and the
// exact error line.
func ExpectExit(t *testing.T, want string, args ...string) {
	t.Helper()
	d := StartDaemon(t, args...)
	code := d.Wait(90 * time.Second)
	got := LastLine(d.Out.String())
	if code != 1 || got != "outboxd: "+want {
		t.Fatalf("exit %d, last line:\n  %s\nwant exit 1 and:\n  outboxd: %s", code, got, want)
	}
}

// RunOnce runs outboxd to completion and returns its exit code and output.
func RunOnce(t *testing.T, args ...string) (int, string) {
	t.Helper()
	d := StartDaemon(t, args...)
	code := d.Wait(60 * time.Second)
	return code, d.Out.String()
}

// ClosedPort is a loopback address nothing listens on.
func ClosedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Values reads n records of topic from the shared Kafka: their values.
func Values(t *testing.T, e *Env, topic string, n int) []string {
	t.Helper()
	var vs []string
	for _, m := range testenv.Kafka(t).ReadAll(t, topic, n, 60*time.Second) {
		vs = append(vs, string(m.Value))
	}
	return vs
}

// MigrateForPoll runs "outboxd migrate --source=poll" on a database where
// "outboxd migrate" ran: it adds the column and the index, then, run again,
// nothing.
func MigrateForPoll(t *testing.T, dsn string) {
	t.Helper()
	for _, want := range []string{
		"migrate: created column public.outbox.published_at\nmigrate: created index public.outbox_unpublished_id_idx\n",
		"migrate: up to date\n",
	} {
		d := StartDaemon(t, "migrate", "--pg-dsn", dsn, "--source=poll", "--log-level=warn")
		code := d.Wait(60 * time.Second)
		// migrate also says whether PUBLIC may still emit logical messages:
		// not what this test is about.
		var got strings.Builder
		for _, l := range strings.SplitAfter(d.Out.String(), "\n") {
			if !strings.Contains(l, "pg_logical_emit_message") {
				got.WriteString(l)
			}
		}
		if code != 0 || got.String() != want {
			t.Fatalf("outboxd migrate --source=poll: exit %d, output:\n%s\nwant exit 0 and:\n%s", code, d.Out, want)
		}
	}
}

// LoginRole creates a role that can log in, with no grants at all unless
// grants (SQL with %s for the role) say so, dropped at cleanup, and returns
// a DSN that logs in as it.
func (e *Env) LoginRole(prefix string, grants ...string) string {
	e.T.Helper()
	role := testenv.UniqueName(prefix)
	e.Exec(`CREATE ROLE ` + pgx.Identifier{role}.Sanitize() + ` LOGIN`)
	e.T.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), e.DSN)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		q := pgx.Identifier{role}.Sanitize()
		_, _ = c.Exec(context.Background(), `DROP OWNED BY `+q+`; DROP ROLE `+q)
	})
	for _, g := range grants {
		e.Exec(fmt.Sprintf(g, pgx.Identifier{role}.Sanitize()))
	}
	u, err := url.Parse(e.DSN)
	if err != nil {
		e.T.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// PGTestVersion is the PostgreSQL major these tests run on:
// OUTBOXD_TEST_PG_VERSION, default 17.
func PGTestVersion() string {
	if v := os.Getenv("OUTBOXD_TEST_PG_VERSION"); v != "" {
		return v
	}
	return "17"
}

// ServerEnv is NewEnv on a private server: a database of its own on srv,
// topics on the shared Kafka.
func ServerEnv(t *testing.T, srv *testenv.PGServer, partitions int32) (*Env, *testenv.KafkaEnv) {
	t.Helper()
	k := testenv.Kafka(t)
	name := testenv.UniqueName(t.Name())
	admin, err := pgx.Connect(context.Background(), srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	e := &Env{T: t, DSN: WithDatabase(t, srv.DSN, name), Brokers: k.Brokers,
		Topic: k.Topic(t, "e2e", partitions), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	return e, k
}

// WithDatabase is a URL DSN with another database.
func WithDatabase(t testing.TB, dsn, db string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

func MustURL(t testing.TB, dsn string) *url.URL {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ResilientWriter inserts single-row transactions at about rate per second
// over writer w's own aggregates (w, w+writers, ...) until ctx ends, riding
// out a failover: on an error it reconnects (e.DSN may name several hosts)
// and writes the next row.
func (e *Env) ResilientWriter(ctx context.Context, w, writers, rate int) error {
	var c *pgx.Conn
	defer func() {
		if c != nil {
			c.Close(context.Background())
		}
	}()
	for seq := 0; ctx.Err() == nil; {
		if c == nil {
			var err error
			if c, err = pgx.Connect(ctx, e.DSN); err != nil {
				c = nil
				time.Sleep(100 * time.Millisecond)
				continue
			}
		}
		agg := fmt.Sprintf("agg-%d", w+writers*(seq%17))
		_, err := c.Exec(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ($1, $2, $3::jsonb)`,
			agg, e.Topic, fmt.Sprintf(`{"writer": %d, "seq": %d}`, w, seq))
		if err != nil {
			c.Close(context.Background())
			c = nil
			continue
		}
		seq++
		time.Sleep(time.Second / time.Duration(rate))
	}
	return nil
}
