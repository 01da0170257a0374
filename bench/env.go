package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/poll"
)

// stack is where the benchmark runs: the dev stack's PostgreSQL (superuser
// DSN of a maintenance database) and Kafka.
type stack struct {
	AdminDSN string
	Brokers  []string
	// PubBrokers, when set, are what the publishers (outboxd, Debezium's
	// worker) and the bare producer bootstrap from: a proxy in front of the
	// broker that the broker advertises (make bench-network). The bench's
	// own admin and consumer use Brokers, the direct listener.
	PubBrokers []string
}

// pubBrokers are the publishers' brokers: PubBrokers, else Brokers.
func (s stack) pubBrokers() []string {
	if len(s.PubBrokers) > 0 {
		return s.PubBrokers
	}
	return s.Brokers
}

// stackFromEnv reads OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS, or the
// .devstack.env that dev/stack up writes at the repo root.
func stackFromEnv(root string) (stack, error) {
	file := map[string]string{}
	if f, err := os.Open(filepath.Join(root, ".devstack.env")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && !strings.HasPrefix(k, "#") {
				file[strings.TrimPrefix(k, "export ")] = strings.Trim(v, `"'`)
			}
		}
		f.Close()
	}
	get := func(k string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return file[k]
	}
	s := stack{AdminDSN: get("OUTBOXD_PG_DSN")}
	for _, b := range strings.Split(get("OUTBOXD_KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			s.Brokers = append(s.Brokers, b)
		}
	}
	if s.AdminDSN == "" || len(s.Brokers) == 0 {
		return s, errors.New("no stack: set OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS, or run `dev/stack up` (make up) to write .devstack.env")
	}
	return s, nil
}

// repoRoot is the folder holding go.mod, from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run from the outboxd repo")
		}
		dir = parent
	}
}

func uniqueName(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// database is one benchmark database with the outbox migrations applied,
// for both sources.
type database struct {
	Name     string
	DSN      string
	adminDSN string
}

func createDatabase(ctx context.Context, s stack, prefix string) (*database, error) {
	admin, err := pgx.Connect(ctx, s.AdminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer admin.Close(context.Background())
	name := uniqueName(prefix)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(s.AdminDSN)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("OUTBOXD_PG_DSN must be a postgres:// URL for the benchmark, got %q", s.AdminDSN)
	}
	u.Path = "/" + name
	db := &database{Name: name, DSN: u.String(), adminDSN: s.AdminDSN}
	conn, err := db.connect(ctx)
	if err != nil {
		db.drop()
		return nil, err
	}
	defer conn.Close(context.Background())
	// outboxd migrate --source=poll: every database gets the poller's
	// column and partial index, CDC runs too, so both sources are measured
	// on one schema (under CDC the index costs one entry per INSERT).
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		db.drop()
		return nil, err
	}
	if _, err := poll.Migrate(ctx, conn, "public", "outbox"); err != nil {
		db.drop()
		return nil, err
	}
	// The cluster preloads pg_stat_statements (dev/stack); the view needs
	// the extension in the database that reads it.
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		db.drop()
		return nil, fmt.Errorf("pg_stat_statements: %w (the server needs shared_preload_libraries = 'pg_stat_statements')", err)
	}
	return db, nil
}

func (d *database) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.Name, err)
	}
	return c, nil
}

// drop terminates the database's backends, drops its replication slots
// (a slot left behind would pin WAL on the shared server) and the database.
func (d *database) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, d.adminDSN)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", d.Name, err)
	}
	defer conn.Close(context.Background())
	for {
		_, err := conn.Exec(ctx, `
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()
			UNION ALL
			SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, d.Name)
		if err != nil {
			return fmt.Errorf("drop database %s: terminate backends: %w", d.Name, err)
		}
		rows, _ := conn.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE database = $1`, d.Name)
		slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("drop database %s: list slots: %w", d.Name, err)
		}
		if len(slots) == 0 {
			break
		}
		for _, s := range slots {
			_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s)
			var pgErr *pgconn.PgError
			if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "55006" || pgErr.Code == "42704")) {
				return fmt.Errorf("drop database %s: drop slot %s: %w", d.Name, s, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: slots %v remain: %w", d.Name, slots, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.Name, err)
	}
	return nil
}

func kafkaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_1_0_0
	c.ClientID = "outboxd-bench"
	c.Net.DialTimeout = 5 * time.Second
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// An exactly-once source's records count when committed, as its
	// consumers see them.
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.MaxWaitTime = 100 * time.Millisecond
	c.Consumer.Fetch.Default = 4 << 20
	c.ChannelBufferSize = 4096
	return c
}

// createTopic creates a topic and waits until every partition has a leader.
func createTopic(s stack, prefix string, partitions int32) (string, error) {
	admin, err := sarama.NewClusterAdmin(s.Brokers, kafkaConfig())
	if err != nil {
		return "", fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	name := uniqueName(prefix)
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		return "", fmt.Errorf("create topic %s: %w", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		md, err := admin.DescribeTopics([]string{name})
		if err == nil && len(md) == 1 && errors.Is(md[0].Err, sarama.ErrNoError) && len(md[0].Partitions) == int(partitions) {
			ready := true
			for _, p := range md[0].Partitions {
				ready = ready && p.Leader >= 0 && errors.Is(p.Err, sarama.ErrNoError)
			}
			if ready {
				return name, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("topic %s: partitions without a leader after 30s (last error: %v)", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func deleteTopic(s stack, name string) {
	admin, err := sarama.NewClusterAdmin(s.Brokers, kafkaConfig())
	if err != nil {
		return
	}
	defer admin.Close()
	_ = admin.DeleteTopic(name)
}
