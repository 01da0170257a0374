package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PG is a database of the test's own on the shared PostgreSQL server.
type PG struct {
	DSN      string // superuser DSN for the test's own database
	Database string // its name
	AdminDSN string // DSN of the maintenance database (the configured one), for CREATE/DROP DATABASE
}

// Postgres gives the test its own fresh database (CREATE DATABASE with a
// unique name), dropped at cleanup (first terminating backends and dropping
// any replication slots in that database).
func Postgres(t testing.TB) *PG {
	t.Helper()
	needServers(t)
	admin := PostgresDSN()
	if admin == "" {
		unavailable(t, hintPG, "PostgreSQL is not configured: %s is unset and no %s was found", pgDSNVar, envFileName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		unavailable(t, hintPG, "PostgreSQL (%s) is not reachable: %v", pgDSNVar, err)
	}
	defer conn.Close(ctx)

	p, err := createDatabase(ctx, conn, admin, t.Name())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Drop(); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return p
}

// PostgresDSN is the shared PostgreSQL's maintenance DSN (OUTBOXD_PG_DSN,
// else .devstack.env's), "" when neither sets it.
func PostgresDSN() string { return setting(pgDSNVar) }

// CreateDatabase creates a fresh database named from prefix (UniqueName) on
// the server of adminDSN, for a program that is not a test (bench/): Postgres
// without the testing.TB. The caller drops it (Drop).
func CreateDatabase(ctx context.Context, adminDSN, prefix string) (*PG, error) {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	return createDatabase(ctx, conn, adminDSN, prefix)
}

// createDatabase creates the database on admin, a connection to adminDSN.
func createDatabase(ctx context.Context, admin *pgx.Conn, adminDSN, prefix string) (*PG, error) {
	name := UniqueName(prefix)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	dsn, err := withParam(adminDSN, "dbname", name)
	if err != nil {
		return nil, err
	}
	return &PG{DSN: dsn, Database: name, AdminDSN: adminDSN}, nil
}

// ReplicationDSN returns DSN with replication=database, for a logical
// replication connection (pgconn.Connect + pglogrepl).
func (p *PG) ReplicationDSN() string {
	dsn, err := withParam(p.DSN, "replication", "database")
	if err != nil {
		panic(err) // DSN was built by withParam already, so it parses
	}
	return dsn
}

// Conn returns a connection to the test's database, closed at cleanup.
func (p *PG) Conn(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", p.Database, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = conn.Close(ctx)
	})
	return conn
}

// Exec runs one statement in the test's database on a connection of its own
// and fails the test on error.
func (p *PG) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", p.Database, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testenv: exec %q: %v", sql, err)
	}
}

// Drop removes the database (Postgres's cleanup does it for a test). A database with replication slots
// cannot be dropped, and an active slot cannot be dropped, so: terminate the
// database's backends (walsenders included), drop its slots, retrying while
// terminated walsenders let go, then DROP DATABASE ... WITH (FORCE).
func (p *PG) Drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.AdminDSN)
	if err != nil {
		return fmt.Errorf("drop database %s: connect: %w", p.Database, err)
	}
	defer conn.Close(ctx)

	for {
		_, err := conn.Exec(ctx, `
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			 WHERE datname = $1 AND pid <> pg_backend_pid()
			UNION ALL
			SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			 WHERE database = $1 AND active_pid IS NOT NULL`, p.Database)
		if err != nil {
			return fmt.Errorf("drop database %s: terminate backends: %w", p.Database, err)
		}
		rows, _ := conn.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE database = $1`, p.Database)
		slots, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("drop database %s: list slots: %w", p.Database, err)
		}
		if len(slots) == 0 {
			break
		}
		for _, slot := range slots {
			_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pgErr) && (pgErr.Code == "55006" || pgErr.Code == "42704"):
				// Still active (its walsender is exiting) or already gone: retry.
			default:
				return fmt.Errorf("drop database %s: drop slot %s: %w", p.Database, slot, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: slots %v still there: %w", p.Database, slots, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{p.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", p.Database, err)
	}
	return nil
}
