package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/kafka"
)

// ErrHook means a post-publish hook failed. The event's transaction is not
// confirmed; the pipeline restarts with backoff, so the event is published
// again (consumers deduplicate by outbox-id) and the hook runs again: a hook
// is never skipped, and must be idempotent.
var ErrHook = errors.New("post-publish hook failed")

// Hook runs after Kafka acknowledged an event and before its transaction can
// be confirmed.
type Hook interface {
	AfterPublish(ctx context.Context, r *kafka.Record) error
}

// ParseHooks parses "TOPIC=SQL" specifications into a topic → SQL map.
func ParseHooks(specs []string) (map[string]string, error) {
	hooks := map[string]string{}
	for _, s := range specs {
		topic, sql, ok := strings.Cut(s, "=")
		topic, sql = strings.TrimSpace(topic), strings.TrimSpace(sql)
		if !ok || topic == "" || sql == "" {
			return nil, fmt.Errorf("hook %q: want TOPIC=SQL", s)
		}
		if _, dup := hooks[topic]; dup {
			return nil, fmt.Errorf("hook for topic %q given twice", topic)
		}
		hooks[topic] = sql
	}
	return hooks, nil
}

// SQLHooks runs one SQL statement per topic on its own connection. The
// statement may use $1 = aggregate_id (text), $2 = outbox id (bigint) and
// $3 = payload; it is given only as many as it references. Topics without a
// hook pass through.
type SQLHooks struct {
	conn  *pgx.Conn
	sql   map[string]string
	nargs map[string]int
}

// NewSQLHooks connects and prepares every statement, so a broken statement
// fails at start, not at the first event.
func NewSQLHooks(ctx context.Context, dsn string, hooks map[string]string) (*SQLHooks, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("hooks: connect: %w", err)
	}
	h := &SQLHooks{conn: conn, sql: hooks, nargs: map[string]int{}}
	for topic, sql := range hooks {
		sd, err := conn.Prepare(ctx, "", sql)
		if err != nil {
			conn.Close(context.Background())
			return nil, fmt.Errorf("hooks: topic %q: prepare %q: %w", topic, sql, err)
		}
		if n := len(sd.ParamOIDs); n > 3 {
			conn.Close(context.Background())
			return nil, fmt.Errorf("hooks: topic %q: statement uses $%d, only $1 (aggregate_id), $2 (outbox id), $3 (payload) exist", topic, n)
		}
		h.nargs[topic] = len(sd.ParamOIDs)
	}
	return h, nil
}

// AfterPublish implements Hook.
func (h *SQLHooks) AfterPublish(ctx context.Context, r *kafka.Record) error {
	sql, ok := h.sql[r.Topic]
	if !ok {
		return nil
	}
	args := []any{string(r.Key), r.OutboxID, string(r.Value)}[:h.nargs[r.Topic]]
	if _, err := h.conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%w: topic %q, outbox id %d: %w", ErrHook, r.Topic, r.OutboxID, err)
	}
	return nil
}

// Close closes the connection.
func (h *SQLHooks) Close() error { return h.conn.Close(context.Background()) }
