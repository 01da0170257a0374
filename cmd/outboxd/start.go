package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/poll"
	"github.com/outboxd/outboxd/slot"
)

// What fails fast and what is retried, the same for both sources:
//
//   - At start, before anything is created, outboxd connects to Kafka and
//     then to PostgreSQL and checks what it needs (the table, its columns,
//     the role). A wrong DSN, an unknown host, a failed authentication or a
//     missing table ends the process with one line and exit status 1:
//     waiting cannot fix them, and the process supervisor (systemd,
//     Kubernetes) retries with its own backoff and shows the failure where
//     operators look.
//   - A server that refuses or does not answer yet, or PostgreSQL saying it
//     is starting up or out of connections, is what a rolling restart or a
//     server started beside outboxd looks like: tried again about once a
//     second, each attempt logged, for --start-timeout (0: the first failure
//     is final), then the same one line and exit status 1.
//   - Once started, losing either connection (a restart, a failover, a
//     broker down) is transient: the session restarts with backoff and
//     nothing is lost.
//
// CDC checks Kafka first so that an unreachable broker never leaves a new
// slot behind, pinning WAL, with nobody reading it.

// checkTimeout bounds each start check once connected, and each attempt
// to connect.
const checkTimeout = 30 * time.Second

// defaultStartTimeout is --start-timeout's default: a minute, about what
// a broker or PostgreSQL restarted beside outboxd takes to listen.
const defaultStartTimeout = time.Minute

// withStartConn runs fn on one PostgreSQL connection, opened within
// --start-timeout and used within checkTimeout: the start checks of run and
// config check --connect.
func withStartConn(ctx context.Context, o *options, log *zap.Logger, fn func(context.Context, *pgx.Conn) error) error {
	deadline := time.Now().Add(o.startTimeout)
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		conn, err := pgx.Connect(cctx, o.pgDSN)
		if err == nil {
			err = fn(cctx, conn)
			conn.Close(context.WithoutCancel(cctx))
			cancel()
			return err
		}
		cancel()
		err = fmt.Errorf("connect to PostgreSQL: %w", err)
		left := time.Until(deadline)
		if !pgNotReadyYet(err) || ctx.Err() != nil || left <= 0 {
			return err
		}
		log.Warn("PostgreSQL is not reachable yet; trying again within --start-timeout",
			zap.Int("attempt", attempt), zap.Duration("left", left.Round(time.Second)), zap.Error(err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(min(time.Second, left)):
		}
	}
}

// pgNotReadyYet reports whether a failed connection is one that waiting
// can fix: refused, timed out, or PostgreSQL starting up, shutting down or
// out of connections. An unknown host, a refused password, a missing
// database or role is final.
func pgNotReadyYet(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P03", "53300": // cannot_connect_now, too_many_connections
			return true
		}
		return false
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return !dnsErr.IsNotFound
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// checkPollTableAtStart checks once that the polling source's table can be
// polled (poll.CheckTable: the message a session would halt with).
func checkPollTableAtStart(ctx context.Context, o *options, log *zap.Logger) error {
	cfg, err := o.pollConfig()
	if err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return withStartConn(ctx, o, log, func(ctx context.Context, conn *pgx.Conn) error {
		return poll.CheckTable(ctx, conn, cfg)
	})
}

// connectFlag is config check's --connect.
const connectFlag = "connect"

// connectCheck is `outboxd config check --connect`: the start checks of run,
// creating nothing, as a checklist; an error when any item fails.
func connectCheck(ctx context.Context, w io.Writer, o *options, kcfg kafka.Config) error {
	// Each attempt of a wait within --start-timeout is a line on w, as
	// run logs it: a check that waits is never silent.
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(w), zap.WarnLevel))
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
	item("Kafka: brokers reachable, security "+o.kafkaSec.Describe(), kafka.Check(ctx, kcfg, o.startTimeout, log))
	if o.poll.source == sourcePoll {
		item("PostgreSQL: the polling source's table and its published_at column", checkPollTableAtStart(ctx, o, log))
	} else {
		item("PostgreSQL: connection, wal_level, outbox table and columns, REPLICATION role, existing slot", preflightOnly(ctx, o, log))
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
func preflightOnly(ctx context.Context, o *options, log *zap.Logger) error {
	return withStartConn(ctx, o, log, func(ctx context.Context, conn *pgx.Conn) error {
		return slot.Preflight(ctx, conn, o.slot, o.pub.DefaultTopic == "")
	})
}
