// Package testenv gives integration tests real PostgreSQL and Kafka servers.
//
// The shared servers come from OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS or,
// when those are unset, from the .devstack.env that `make up` (dev/stack up)
// writes at the repo root. Each test gets its own database ([Postgres]) and
// its own topics ([KafkaEnv.Topic]), so tests can run in parallel against
// one stack. Tests that must stop or restart a server start a private one
// with [StartPostgres] or [StartKafka], and tests of broker failover a
// private replicated cluster with [StartKafkaCluster].
//
// When a server is not configured or not reachable, the test is skipped, or
// fails when CI=true, with a message that says to run `make up`.
package testenv

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const (
	pgDSNVar        = "OUTBOXD_PG_DSN"
	kafkaBrokersVar = "OUTBOXD_KAFKA_BROKERS"
	envFileName     = ".devstack.env"
)

// devstackEnv reads .devstack.env once per test binary; nil when none is found.
var devstackEnv = sync.OnceValue(func() map[string]string {
	wd, err := os.Getwd()
	if err != nil {
		return nil
	}
	path, ok := findUp(wd, envFileName)
	if !ok {
		return nil
	}
	env, err := readEnvFile(path)
	if err != nil {
		return nil
	}
	return env
})

// setting returns the environment variable name, or its value in .devstack.env.
func setting(name string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return devstackEnv()[name]
}

// findUp looks for name in dir and its parents, up to the repo root (see
// isRepoRoot), and returns its path.
func findUp(dir, name string) (string, bool) {
	for {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
		if isRepoRoot(dir) {
			return "", false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// readEnvFile parses KEY=value lines; blank lines and # comments are skipped
// and one pair of surrounding quotes is removed from a value.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open env file: %w", err)
	}
	defer f.Close()
	env := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		key = strings.TrimSpace(strings.TrimPrefix(key, "export "))
		value = strings.TrimSpace(value)
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			value = value[1 : len(value)-1]
		}
		env[key] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return env, nil
}

// Hints that unavailable appends to its message.
const (
	hintPG      = "run `make up`, or set " + pgDSNVar + " to your own server"
	hintKafka   = "run `make up`, or set " + kafkaBrokersVar + " to your own brokers"
	hintPrivate = "run `make deps` (dev/stack needs PostgreSQL, Java and Maven)"
)

// needServers skips a test that needs real servers when -short is set
// (make unit), whatever CI says: -short asks for the fast suite.
func needServers(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("testenv: needs PostgreSQL/Kafka; skipped by -short (make unit)")
	}
}

// unavailable skips the test, or fails it under CI=true, because a server it
// needs is not configured, not reachable or cannot be started.
func unavailable(t testing.TB, hint, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...) + "; " + hint
	if os.Getenv("CI") == "true" {
		t.Fatalf("testenv: %s", msg)
	}
	t.Skipf("testenv: %s", msg)
}

// modulePath is the main module's path: its go.mod marks the repo root. A
// nested module (bench/) has a go.mod of its own, which the search passes.
const modulePath = "github.com/outboxd/outboxd"

// isRepoRoot reports whether dir holds the go.mod of modulePath.
func isRepoRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == modulePath
		}
	}
	return false
}

// FindRepoRoot returns the repo root (the folder holding the main module's
// go.mod), found from dir up.
func FindRepoRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if isRepoRoot(d) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod of %s above %s: run from the outboxd repo", modulePath, dir)
		}
	}
}

// RepoRoot returns the repo root, found from the working directory up.
func RepoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: working directory: %v", err)
	}
	root, err := FindRepoRoot(wd)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return root
}

// UniqueName returns prefix, lowercased and reduced to [a-z0-9_] (at most 40
// characters), followed by '_' and 12 random hex digits: a valid unquoted
// PostgreSQL identifier and Kafka topic name, unique across tests and runs.
func UniqueName(prefix string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(prefix) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	p := b.String()
	if p == "" || (p[0] >= '0' && p[0] <= '9') {
		p = "t" + p // identifiers may not start with a digit
	}
	var random [6]byte
	_, _ = rand.Read(random[:]) // never fails (crypto/rand)
	return p + "_" + hex.EncodeToString(random[:])
}

// withParam returns dsn with one connection parameter set, for both the URL
// form (postgres://...) and the keyword/value form (host=... dbname=...).
func withParam(dsn, key, value string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse DSN: %w", err)
		}
		if key == "dbname" {
			u.Path = "/" + value
			u.RawPath = ""
			return u.String(), nil
		}
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value) + "'"
	return strings.TrimSpace(dsn) + " " + key + "=" + quoted, nil
}
