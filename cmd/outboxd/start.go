package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/slot"
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
	return kafka.Check(ctx, kcfg, logger)
}

// checkPollTableAtStart connects to PostgreSQL once and checks that the
// polling source's table is there with its published_at column.
func checkPollTableAtStart(ctx context.Context, o *options) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	table := pgx.Identifier{o.slot.Schema, o.slot.Table}.Sanitize()
	plain := o.slot.Schema + "." + o.slot.Table
	var exists, hasColumn bool
	err = conn.QueryRow(ctx, `
		SELECT to_regclass($1) IS NOT NULL,
		       EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)
		                 AND attname = 'published_at' AND NOT attisdropped)`, table).Scan(&exists, &hasColumn)
	if err != nil {
		return fmt.Errorf("check the outbox table %s: %w", plain, err)
	}
	switch {
	case !exists:
		return fmt.Errorf("outbox table %s does not exist: run \"outboxd migrate --source=poll\" or create it (or set --schema/--table)", plain)
	case !hasColumn:
		return fmt.Errorf("outbox table %s has no column \"published_at\": run \"outboxd migrate --source=poll\" (poll.Migrate adds it)", plain)
	}
	return nil
}

// connectFlag is config check's --connect.
const connectFlag = "connect"

// connectCheck is `outboxd config check --connect`: the start checks of run,
// creating nothing, as a checklist; an error when any item fails.
func connectCheck(ctx context.Context, w io.Writer, o *options, kcfg kafka.Config) error {
	failed := 0
	item := func(what string, err error) {
		if err != nil {
			failed++
			fmt.Fprintf(w, "  FAIL %s: %s\n", what, strings.ReplaceAll(err.Error(), "\n\t", "; "))
			return
		}
		fmt.Fprintf(w, "  ok   %s\n", what)
	}
	fmt.Fprintln(w, "config check --connect:")
	item("Kafka: brokers reachable, security "+o.kafkaSec.Describe(), kafka.Check(ctx, kcfg, zap.NewNop()))
	if o.poll.source == sourcePoll {
		item("PostgreSQL: the polling source's table and its published_at column", checkPollTableAtStart(ctx, o))
	} else {
		item("PostgreSQL: connection, wal_level, outbox table and columns, REPLICATION role, existing slot", preflightOnly(ctx, o))
	}
	if failed > 0 {
		return fmt.Errorf("config check --connect: %d of the checks above failed", failed)
	}
	fmt.Fprintln(w, "config check --connect: outboxd run can start (it creates a missing publication and slot)")
	return nil
}

// preflightOnly connects and runs the preflight checks of run, creating
// nothing.
func preflightOnly(ctx context.Context, o *options) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return slot.Preflight(ctx, conn, o.slot, o.pub.DefaultTopic == "")
}
