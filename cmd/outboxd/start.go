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
	"github.com/outboxd/outboxd/poll"
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

// withStartConn runs fn on one PostgreSQL connection, opened and used
// within startTimeout: the start checks of run and config check --connect.
func withStartConn(ctx context.Context, o *options, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, o.pgDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(ctx, conn)
}

// checkPollTableAtStart checks once that the polling source's table can be
// polled (poll.CheckTable: the message a session would halt with).
func checkPollTableAtStart(ctx context.Context, o *options) error {
	cfg, err := o.pollConfig()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return withStartConn(ctx, o, func(ctx context.Context, conn *pgx.Conn) error {
		return poll.CheckTable(ctx, conn, cfg)
	})
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
	if c, err := o.formats.config(o); err == nil && c.NeedsRegistry() {
		item("Schema Registry: "+redactURLs(o.formats.registryURL)+" reachable, credentials accepted", o.formats.checkRegistry(ctx))
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
	return withStartConn(ctx, o, func(ctx context.Context, conn *pgx.Conn) error {
		return slot.Preflight(ctx, conn, o.slot, o.pub.DefaultTopic == "")
	})
}
