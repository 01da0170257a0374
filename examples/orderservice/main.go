// Command orderservice is the order service of the outboxd demo. It writes
// business rows and their events in one transaction each (the transactional
// outbox); outboxd publishes the events to Kafka.
//
//	orderservice --count 100                       # 100 orders, each with its order.created event
//	orderservice --set-status 7=accepted [--set-status 8=completed ...]
//
// --set-status records what the establishment reports, without judging it:
// an invalid transition is written like any other, and it is the status
// consumer's projection that refuses it (into its dead-letter topic). Each
// change updates orders.status and writes an order.status_changed event to
// the status topic, in one transaction.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/examples/internal/brew"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "orderservice:", err)
		}
		os.Exit(1)
	}
}

// statusChange is one --set-status ID=STATUS.
type statusChange struct {
	orderID int64
	status  string
}

type statusChanges []statusChange

func (s *statusChanges) String() string { return fmt.Sprint(*s) }

func (s *statusChanges) Set(v string) error {
	id, status, ok := strings.Cut(v, "=")
	n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
	status = strings.TrimSpace(status)
	if !ok || err != nil || n <= 0 {
		return fmt.Errorf("want ORDER_ID=STATUS, got %q", v)
	}
	if !brew.KnownStatus(status) {
		return fmt.Errorf("unknown status %q (known: %s)", status, strings.Join(brew.Statuses, ", "))
	}
	*s = append(*s, statusChange{orderID: n, status: status})
	return nil
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orderservice", flag.ContinueOnError)
	dsn := fs.String("pg-dsn", os.Getenv("OUTBOXD_PG_DSN"), "PostgreSQL connection string (env OUTBOXD_PG_DSN)")
	count := fs.Int("count", 0, "create this many orders, one transaction each")
	topic := fs.String("topic", brew.OrdersTopic, "topic of order.created events")
	statusTopic := fs.String("status-topic", brew.StatusTopic, "topic of order.status_changed events")
	emitEvents := fs.Bool("emit", false, "write events with outbox_emit (the table-less outbox: WAL messages, no outbox rows; run outboxd with --source=messages or cdc, PostgreSQL 14+) instead of outbox rows")
	var changes statusChanges
	fs.Var(&changes, "set-status", "record a status change ORDER_ID=STATUS (repeatable, applied in order)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *dsn == "" {
		return errors.New("no --pg-dsn (or OUTBOXD_PG_DSN)")
	}
	if *count <= 0 && len(changes) == 0 {
		return errors.New("nothing to do: give --count N and/or --set-status ID=STATUS")
	}
	conn, err := pgx.Connect(ctx, *dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	write := insertRow
	if *emitEvents {
		write = emitMessage
	}

	if *count > 0 {
		var first, last int64
		for i := range *count {
			id, _, err := createOrder(ctx, conn, write, *topic, customer(i), amountCents(i))
			if err != nil {
				return fmt.Errorf("order %d of %d: %w", i+1, *count, err)
			}
			if i == 0 {
				first = id
			}
			last = id
		}
		fmt.Printf("created %d orders (ids %d-%d), each in one transaction with its %s event on %s\n",
			*count, first, last, brew.TypeOrderCreated, *topic)
	}
	for _, c := range changes {
		prev, outboxID, err := setStatus(ctx, conn, write, *statusTopic, c.orderID, c.status)
		if err != nil {
			return fmt.Errorf("order %d: %w", c.orderID, err)
		}
		fmt.Printf("order %d: %s -> %s (outbox id %d)\n", c.orderID, prev, c.status, outboxID)
	}
	return nil
}

// customer and amountCents make deterministic demo data.
func customer(i int) string   { return fmt.Sprintf("customer-%d", i%17+1) }
func amountCents(i int) int64 { return int64(450 + (i*137)%2500) }

// writeEvent writes one event in tx and returns its outbox id.
type writeEvent func(ctx context.Context, tx pgx.Tx, aggregateID, topic string, payload []byte) (int64, error)

// insertRow writes the event as an outbox row; its id is the outbox id.
func insertRow(ctx context.Context, tx pgx.Tx, aggregateID, topic string, payload []byte) (id int64, err error) {
	err = tx.QueryRow(ctx,
		`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ($1, $2, $3) RETURNING id`,
		aggregateID, topic, string(payload)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("insert outbox row: %w", err)
	}
	return id, nil
}

// emitMessage writes the event with outbox_emit, as a WAL message that is
// published only if tx commits; its LSN is the outbox id outboxd sends.
func emitMessage(ctx context.Context, tx pgx.Tx, aggregateID, topic string, payload []byte) (id int64, err error) {
	err = tx.QueryRow(ctx, `SELECT (outbox_emit($1, $2, $3::jsonb) - '0/0'::pg_lsn)::bigint`,
		topic, aggregateID, string(payload)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("emit outbox message: %w", err)
	}
	return id, nil
}

// createOrder inserts an order and writes its order.created event in one
// transaction: if either fails, neither exists.
func createOrder(ctx context.Context, conn *pgx.Conn, write writeEvent, topic, customer string, amountCents int64) (orderID, outboxID int64, err error) {
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		ev := brew.OrderCreated{Type: brew.TypeOrderCreated, Customer: customer}
		err := tx.QueryRow(ctx,
			`INSERT INTO orders (customer, amount) VALUES ($1, $2::numeric / 100) RETURNING id, amount::text, status`,
			customer, amountCents).Scan(&ev.ID, &ev.Amount, &ev.Status)
		if err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		payload, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		if outboxID, err = write(ctx, tx, brew.AggregateID(ev.ID), topic, payload); err != nil {
			return err
		}
		orderID = ev.ID
		return nil
	})
	return orderID, outboxID, err
}

// errNoOrder means --set-status named an order that does not exist.
var errNoOrder = errors.New("no such order")

// setStatus updates the order's status and writes its order.status_changed
// event in one transaction, and returns the previous status.
func setStatus(ctx context.Context, conn *pgx.Conn, write writeEvent, topic string, orderID int64, status string) (prev string, outboxID int64, err error) {
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			UPDATE orders o SET status = $2, updated_at = now()
			  FROM (SELECT id, status FROM orders WHERE id = $1 FOR UPDATE) p
			 WHERE o.id = p.id
			RETURNING p.status`, orderID, status).Scan(&prev)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNoOrder
		}
		if err != nil {
			return fmt.Errorf("update order: %w", err)
		}
		payload, err := json.Marshal(brew.StatusChanged{Type: brew.TypeStatusChanged, ID: orderID, Status: status})
		if err != nil {
			return fmt.Errorf("encode event: %w", err)
		}
		outboxID, err = write(ctx, tx, brew.AggregateID(orderID), topic, payload)
		return err
	})
	return prev, outboxID, err
}
