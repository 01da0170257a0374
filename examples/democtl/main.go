// Command democtl is the demo's toolbox: it prepares the database and the
// topics, counts, waits and runs the final check. examples/demo.sh (and so
// the Makefile's demo targets) call it.
//
//	democtl dsn DB                 print OUTBOXD_PG_DSN with its database set to DB
//	democtl reset-db DB            drop database DB (its replication slots first), create it empty
//	democtl migrate                create the examples' tables (orders, order_status) and the
//	                               consumer's processed_outbox_ids, after "outboxd migrate"
//	democtl topics T:P ...         delete and recreate topics with P partitions
//	democtl delete-group           forget the consumer group's offsets
//	democtl count WHAT             print one number; WHAT is orders, outbox, pending,
//	                               processed, dup, dlq or end-offsets
//	democtl wait-published         wait until outbox pending = 0
//	democtl wait-consumed          wait until the group committed every record
//	democtl check --orders N --invalid N
//	democtl hook                   print the demo's --hook TOPIC=SQL for outboxd run
//
// Settings (flags after the command, or the environment): --pg-dsn
// (DEMO_PG_DSN, the demo database), --kafka-brokers (OUTBOXD_KAFKA_BROKERS),
// --slot and --publication (DEMO_SLOT, DEMO_PUBLICATION), --group
// (DEMO_GROUP).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/examples/internal/brew"
	"github.com/outboxd/outboxd/examples/internal/democheck"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "democtl:", err)
		}
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type settings struct {
	dsn, brokers, slot, publication, group string
	orders, invalid                        int64
	timeout                                time.Duration
}

func (s *settings) names() democheck.Names {
	return democheck.Names{
		Slot: s.slot, Publication: s.publication,
		OrdersTopic: brew.OrdersTopic, StatusTopic: brew.StatusTopic,
		DLQTopics: []string{brew.OrdersTopic + ".dlq", brew.StatusTopic + ".dlq"},
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: democtl dsn|reset-db|migrate|topics|delete-group|count|wait-published|wait-consumed|check|hook [flags] (see the package doc)")
	}
	cmd := args[0]
	s := &settings{}
	fs := flag.NewFlagSet("democtl "+cmd, flag.ContinueOnError)
	fs.StringVar(&s.dsn, "pg-dsn", env("DEMO_PG_DSN", os.Getenv("OUTBOXD_PG_DSN")), "demo database (env DEMO_PG_DSN)")
	fs.StringVar(&s.brokers, "kafka-brokers", os.Getenv("OUTBOXD_KAFKA_BROKERS"), "Kafka brokers (env OUTBOXD_KAFKA_BROKERS)")
	fs.StringVar(&s.slot, "slot", env("DEMO_SLOT", "outboxd_demo"), "outboxd's replication slot (env DEMO_SLOT)")
	fs.StringVar(&s.publication, "publication", env("DEMO_PUBLICATION", "outboxd_demo"), "outboxd's publication (env DEMO_PUBLICATION)")
	fs.StringVar(&s.group, "group", env("DEMO_GROUP", "statusconsumer"), "the consumer group (env DEMO_GROUP)")
	fs.Int64Var(&s.orders, "orders", 100, "check: orders the demo created")
	fs.Int64Var(&s.invalid, "invalid", 0, "check: invalid transitions the demo wrote")
	fs.DurationVar(&s.timeout, "timeout", 2*time.Minute, "wait-*: give up after this long")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	rest := fs.Args()

	switch cmd {
	case "dsn":
		if len(rest) != 1 {
			return errors.New("usage: democtl dsn DATABASE")
		}
		dsn, err := withDatabase(os.Getenv("OUTBOXD_PG_DSN"), rest[0])
		if err != nil {
			return err
		}
		fmt.Println(dsn)
		return nil
	case "hook":
		fmt.Println(brew.OrdersTopic + "=" + brew.SentHookSQL(brew.StatusTopic))
		return nil
	case "reset-db":
		if len(rest) != 1 {
			return errors.New("usage: democtl reset-db DATABASE")
		}
		return resetDB(ctx, os.Getenv("OUTBOXD_PG_DSN"), rest[0])
	case "migrate":
		if s.dsn == "" {
			return errors.New("no --pg-dsn (or DEMO_PG_DSN)")
		}
		conn, err := pgx.Connect(ctx, s.dsn)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		defer conn.Close(context.Background())
		applied, err := brew.Migrate(ctx, conn, nil)
		for _, a := range applied {
			fmt.Printf("democtl migrate: applied %s (examples/internal/brew/migrations)\n", a)
		}
		if err != nil {
			return err
		}
		fmt.Println("democtl migrate: orders, order_status and the consumer's processed_outbox_ids ready")
		return nil
	case "topics":
		return withKafka(s, func(client sarama.Client, admin sarama.ClusterAdmin) error {
			return recreateTopics(ctx, admin, rest)
		})
	case "delete-group":
		return withKafka(s, func(client sarama.Client, admin sarama.ClusterAdmin) error {
			// A member that crashed stays in the group until its session
			// times out: wait for that, not for a live consumer.
			return waitFor(ctx, 30*time.Second, "group "+s.group+" deleted", func() (bool, string, error) {
				err := admin.DeleteConsumerGroup(s.group)
				if err == nil || errors.Is(err, sarama.ErrGroupIDNotFound) {
					return true, "gone", nil
				}
				if errors.Is(err, sarama.ErrNonEmptyGroup) {
					return false, "it still has members (stop its consumers)", nil
				}
				return false, "", fmt.Errorf("delete group %s: %w", s.group, err)
			})
		})
	case "count":
		if len(rest) != 1 {
			return errors.New("usage: democtl count orders|outbox|pending|processed|dup|dlq|end-offsets")
		}
		return count(ctx, s, rest[0])
	case "wait-published":
		return waitFor(ctx, s.timeout, "outbox pending = 0", func() (bool, string, error) {
			n, err := withConnValue(ctx, s, func(conn *pgx.Conn) (int64, error) {
				return democheck.PendingOutbox(ctx, conn, s.slot, s.publication)
			})
			return n == 0, fmt.Sprintf("pending=%d", n), err
		})
	case "wait-consumed":
		return withKafka(s, func(client sarama.Client, admin sarama.ClusterAdmin) error {
			return waitFor(ctx, s.timeout, "consumer lag = 0", func() (bool, string, error) {
				lag, err := democheck.Lag(client, admin, s.group, brew.OrdersTopic, brew.StatusTopic)
				return lag == 0, fmt.Sprintf("lag=%d", lag), err
			})
		})
	case "check":
		return withKafka(s, func(client sarama.Client, _ sarama.ClusterAdmin) error {
			conn, err := pgx.Connect(ctx, s.dsn)
			if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			defer conn.Close(context.Background())
			c, err := democheck.Collect(ctx, conn, client, s.names())
			if err != nil {
				return err
			}
			if !c.Report(os.Stdout, s.names(), s.orders, s.invalid) {
				return errors.New("the demo's check failed")
			}
			return nil
		})
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// count prints one number.
func count(ctx context.Context, s *settings, what string) error {
	sqls := map[string]string{
		"orders":    `SELECT count(*) FROM orders`,
		"outbox":    `SELECT count(*) FROM outbox`,
		"processed": `SELECT count(*) FROM processed_outbox_ids`,
		"dup":       `SELECT coalesce(sum(duplicates), 0) FROM processed_outbox_ids`,
	}
	var n int64
	var err error
	switch what {
	case "orders", "outbox", "processed", "dup":
		n, err = withConnValue(ctx, s, func(conn *pgx.Conn) (int64, error) {
			var n int64
			return n, conn.QueryRow(ctx, sqls[what]).Scan(&n)
		})
	case "pending":
		n, err = withConnValue(ctx, s, func(conn *pgx.Conn) (int64, error) {
			return democheck.PendingOutbox(ctx, conn, s.slot, s.publication)
		})
	case "dlq", "end-offsets":
		err = withKafka(s, func(client sarama.Client, _ sarama.ClusterAdmin) error {
			topics := []string{brew.OrdersTopic, brew.StatusTopic}
			if what == "dlq" {
				topics = s.names().DLQTopics
			}
			ends, err := democheck.EndOffsets(client, topics...)
			if err != nil {
				return err
			}
			for _, t := range topics {
				fmt.Printf("%s %d\n", t, democheck.Sum(ends[t]))
				n += democheck.Sum(ends[t])
			}
			return nil
		})
	default:
		return fmt.Errorf("count %q: want orders, outbox, pending, processed, dup, dlq or end-offsets", what)
	}
	if err != nil {
		return err
	}
	fmt.Println(n)
	return nil
}

func withConnValue(ctx context.Context, s *settings, f func(*pgx.Conn) (int64, error)) (int64, error) {
	if s.dsn == "" {
		return 0, errors.New("no --pg-dsn (or DEMO_PG_DSN)")
	}
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	return f(conn)
}

func withKafka(s *settings, f func(sarama.Client, sarama.ClusterAdmin) error) error {
	if s.brokers == "" {
		return errors.New("no --kafka-brokers (or OUTBOXD_KAFKA_BROKERS)")
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	cfg.ClientID = "democtl"
	client, err := sarama.NewClient(strings.Split(s.brokers, ","), cfg)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	// Closing the admin closes the client too; the deferred client Close
	// then only reports that it is closed already.
	defer admin.Close()
	return f(client, admin)
}

// waitFor polls cond every 500 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state, err := cond()
		if err == nil && ok {
			fmt.Printf("%s (%s)\n", what, state)
			return nil
		}
		if err != nil {
			state = err.Error()
		}
		if state != last {
			fmt.Printf("waiting for %s: %s\n", what, state)
			last = state
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s after %s (%s)", what, timeout, state)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// withDatabase returns dsn (URL or key=value form) with its database set.
func withDatabase(dsn, db string) (string, error) {
	if dsn == "" {
		return "", errors.New("OUTBOXD_PG_DSN is not set")
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse OUTBOXD_PG_DSN: %w", err)
		}
		u.Path, u.RawPath = "/"+db, ""
		return u.String(), nil
	}
	return strings.TrimSpace(dsn) + " dbname=" + db, nil // a later keyword wins
}

// resetDB drops database db (after its replication slots, which would keep
// it) and creates it empty.
func resetDB(ctx context.Context, adminDSN, db string) error {
	if adminDSN == "" {
		return errors.New("OUTBOXD_PG_DSN is not set")
	}
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := conn.Exec(ctx, `
			SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, db)
		if err != nil {
			return fmt.Errorf("stop the slots' walsenders: %w", err)
		}
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, db)
		var pgErr *pgconn.PgError
		if err == nil {
			break
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" || time.Now().After(deadline) { // 55006: still active
			return fmt.Errorf("drop the replication slots of %s: %w", db, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ident := pgx.Identifier{db}.Sanitize()
	if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+ident+` WITH (FORCE)`); err != nil {
		return fmt.Errorf("drop database %s: %w", db, err)
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+ident); err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	fmt.Printf("database %s created empty\n", db)
	return nil
}

// recreateTopics deletes each TOPIC:PARTITIONS given, waits until it is gone,
// creates it again and waits for its leaders.
func recreateTopics(ctx context.Context, admin sarama.ClusterAdmin, specs []string) error {
	if len(specs) == 0 {
		return errors.New("usage: democtl topics TOPIC:PARTITIONS ...")
	}
	for _, spec := range specs {
		name, ps, _ := strings.Cut(spec, ":")
		parts, err := strconv.Atoi(ps)
		if err != nil || parts < 1 || name == "" {
			return fmt.Errorf("topic %q: want NAME:PARTITIONS", spec)
		}
		if err := admin.DeleteTopic(name); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", name, err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(parts), ReplicationFactor: 1}, false)
			if err == nil {
				break
			}
			// The deletion is asynchronous: "already exists" (marked for
			// deletion) until the broker is done.
			if !errors.Is(err, sarama.ErrTopicAlreadyExists) || time.Now().After(deadline) {
				return fmt.Errorf("create topic %s: %w", name, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		if err := waitLeaders(ctx, admin, name, parts); err != nil {
			return err
		}
		fmt.Printf("topic %s created with %d partitions\n", name, parts)
	}
	return nil
}

func waitLeaders(ctx context.Context, admin sarama.ClusterAdmin, topic string, parts int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		md, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && errors.Is(md[0].Err, sarama.ErrNoError) && len(md[0].Partitions) == parts {
			ready := true
			for _, p := range md[0].Partitions {
				ready = ready && p.Leader >= 0 && errors.Is(p.Err, sarama.ErrNoError)
			}
			if ready {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s: partitions without a leader after 60s (%v)", topic, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
