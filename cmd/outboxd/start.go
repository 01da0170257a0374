package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
)

// What fails fast and what is retried, the same for both sources:
//
//   - At start, before anything is created, outboxd connects to Kafka and
//     to PostgreSQL once and checks what it needs (the table, its columns,
//     the role). A wrong DSN or broker address, an unknown host, a refused
//     or timed-out connection, a failed authentication or a missing table
//     ends the process with one line and exit status 1: waiting cannot fix
//     them, and the process supervisor (systemd, Kubernetes) retries with its
//     own backoff and shows the failure where operators look.
//   - Once started, losing either connection (a restart, a failover, a
//     broker down) is transient: the session restarts with backoff and
//     nothing is lost.
//
// CDC checks Kafka first so that an unreachable broker never leaves a new
// slot behind, pinning WAL, with nobody reading it.

// startTimeout bounds each start check.
const startTimeout = 30 * time.Second

// checkKafkaAtStart connects to the brokers once (and authenticates).
func checkKafkaAtStart(ctx context.Context, kcfg kafka.Config, logger *zap.Logger) error {
	if err := kafka.Check(ctx, kcfg, logger); err != nil {
		return fmt.Errorf("at start: %w", err)
	}
	return nil
}

// checkPollTableAtStart connects to PostgreSQL once and checks that the
// polling source's table is there with its published_at column.
func checkPollTableAtStart(ctx context.Context, o *options) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("at start: connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	table := pgx.Identifier{o.slot.Schema, o.slot.Table}.Sanitize()
	var exists, hasColumn bool
	err = conn.QueryRow(ctx, `
		SELECT to_regclass($1) IS NOT NULL,
		       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)
		                 AND attname = 'published_at' AND NOT attisdropped)`, table).Scan(&exists, &hasColumn)
	if err != nil {
		return fmt.Errorf("at start: check the outbox table %s: %w", table, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("at start: the outbox table %s does not exist: run outboxd migrate --source=poll (or set --schema/--table)", table)
	case !hasColumn:
		return fmt.Errorf("at start: the outbox table %s has no published_at column, which the polling source needs: run outboxd migrate --source=poll", table)
	}
	return nil
}
