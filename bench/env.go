package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
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

// stackFromEnv is the dev stack the tests use (internal/testenv):
// OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS, or the .devstack.env that
// dev/stack up writes at the repo root.
func stackFromEnv() (stack, error) {
	s := stack{AdminDSN: testenv.PostgresDSN(), Brokers: testenv.KafkaBrokers()}
	if s.AdminDSN == "" || len(s.Brokers) == 0 {
		return s, errors.New("no stack: set OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS, or run `dev/stack up` (make up) to write .devstack.env")
	}
	return s, nil
}

// kafka is the bench's Kafka (the direct listener) for creating topics.
func (s stack) kafka() *testenv.KafkaEnv { return &testenv.KafkaEnv{Brokers: s.Brokers} }

// repoRoot is the outboxd repo's root, from the working directory up.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return testenv.FindRepoRoot(wd)
}

// database is one benchmark database (testenv's) with the outbox
// migrations applied, for both sources.
type database struct{ *testenv.PG }

func createDatabase(ctx context.Context, s stack, prefix string) (*database, error) {
	u, err := url.Parse(s.AdminDSN)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("OUTBOXD_PG_DSN must be a postgres:// URL for the benchmark, got %q", s.AdminDSN)
	}
	pg, err := testenv.CreateDatabase(ctx, s.AdminDSN, prefix)
	if err != nil {
		return nil, err
	}
	db := &database{pg}
	if err := db.migrate(ctx); err != nil {
		_ = db.drop()
		return nil, err
	}
	return db, nil
}

// migrate is outboxd migrate --source=poll: every database gets the
// poller's column and partial index, CDC runs too, so both sources are
// measured on one schema (under CDC the index costs one entry per INSERT).
func (d *database) migrate(ctx context.Context) error {
	conn, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(ctx, conn, nil); err != nil {
		return err
	}
	if _, err := poll.Migrate(ctx, conn, "public", "outbox"); err != nil {
		return err
	}
	// The cluster preloads pg_stat_statements (dev/stack); the view needs
	// the extension in the database that reads it.
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return fmt.Errorf("pg_stat_statements: %w (the server needs shared_preload_libraries = 'pg_stat_statements')", err)
	}
	return nil
}

func (d *database) connect(ctx context.Context) (*pgx.Conn, error) {
	c, err := pgx.Connect(ctx, d.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.Database, err)
	}
	return c, nil
}

// drop terminates the database's backends, drops its replication slots
// (a slot left behind would pin WAL on the shared server) and the database.
func (d *database) drop() error { return d.Drop() }

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

// producerConfig is a producer with outboxd's settings: idempotent,
// acks=all, one request in flight, every record reported back.
func producerConfig() *sarama.Config {
	c := kafkaConfig()
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1
	c.Producer.Flush.Frequency = 0
	return c
}

// createTopic creates a topic and waits until every partition has a leader.
func createTopic(s stack, prefix string, partitions int32) (string, error) {
	return s.kafka().CreateTopic(prefix, partitions)
}

func deleteTopic(s stack, name string) { _ = s.kafka().DeleteTopic(name) }
