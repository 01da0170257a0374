package testenv

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestUniqueName(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	for _, prefix := range []string{"", "orders", "TestFoo/Sub-Case.1", "9lives", strings.Repeat("x", 100)} {
		a, b := UniqueName(prefix), UniqueName(prefix)
		if a == b {
			t.Errorf("UniqueName(%q) twice gave %q", prefix, a)
		}
		if !valid.MatchString(a) {
			t.Errorf("UniqueName(%q) = %q: not a plain identifier of at most 63 bytes", prefix, a)
		}
	}
}

func TestWithParam(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://postgres@127.0.0.1:5432/outboxd?sslmode=disable",
		"host=127.0.0.1 port=5432 user=postgres dbname=outboxd sslmode=disable",
	} {
		withDB, err := withParam(dsn, "dbname", "test_db")
		if err != nil {
			t.Fatal(err)
		}
		repl, err := withParam(withDB, "replication", "database")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgconn.ParseConfig(repl)
		if err != nil {
			t.Fatalf("parse %q: %v", repl, err)
		}
		if cfg.Database != "test_db" || cfg.RuntimeParams["replication"] != "database" ||
			cfg.Port != 5432 || cfg.User != "postgres" {
			t.Errorf("%q: got database %q, replication %q, port %d, user %q",
				repl, cfg.Database, cfg.RuntimeParams["replication"], cfg.Port, cfg.User)
		}
	}
}

func TestReadEnvFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), ".devstack.env")
	content := "# comment\n\nOUTBOXD_PG_DSN=postgres://p@h:1/d?sslmode=disable\nexport OUTBOXD_KAFKA_BROKERS='127.0.0.1:9092'\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	env, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := env["OUTBOXD_PG_DSN"]; got != "postgres://p@h:1/d?sslmode=disable" {
		t.Errorf("OUTBOXD_PG_DSN = %q", got)
	}
	if got := env["OUTBOXD_KAFKA_BROKERS"]; got != "127.0.0.1:9092" {
		t.Errorf("OUTBOXD_KAFKA_BROKERS = %q", got)
	}
}

func TestRepoRoot(t *testing.T) {
	t.Parallel()
	root := RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "dev", "stack")); err != nil {
		t.Errorf("RepoRoot = %s, which has no dev/stack: %v", root, err)
	}
}
