package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PGServer is a private PostgreSQL server (dev/stack pg-*), for tests that
// stop or restart it. Its methods fail the test on error, so call them from
// the test's goroutine.
type PGServer struct {
	DSN  string // superuser DSN, database "postgres"
	Dir  string // instance folder: data/, postgres.log, port
	Port int

	t testing.TB
}

// StartPostgres initialises and starts a private PostgreSQL (same settings
// as the dev stack: wal_level=logical and so on) in a temporary folder; it
// is stopped and removed at cleanup. It is Debian's PostgreSQL (15); see
// [StartPostgresVersion] for another major.
func StartPostgres(t testing.TB) *PGServer {
	t.Helper()
	return startPostgres(t, "")
}

// StartPostgresVersion is [StartPostgres] with PostgreSQL of the given major
// version ("14", "16", "17"; "15" is Debian's) or full version ("17.6.0"), a
// build from Maven Central that dev/stack fetches once into .cache/. Like
// StartPostgres, it skips the test (fails it under CI=true) when the server
// cannot be created.
func StartPostgresVersion(t testing.TB, version string) *PGServer {
	t.Helper()
	if version == "" {
		t.Fatalf("testenv: StartPostgresVersion needs a version")
	}
	return startPostgres(t, version)
}

func startPostgres(t testing.TB, version string) *PGServer {
	t.Helper()
	s := newPGServer(t, "outboxd-pg-")
	dir, port := s.Dir, s.Port
	args := []string{"pg-init", dir, strconv.Itoa(port)}
	if version != "" {
		args = append(args, "--version", version)
	}
	if err := stack(args...); err != nil {
		what := "a private PostgreSQL"
		if version != "" {
			what = "a private PostgreSQL " + version
		}
		unavailable(t, hintPrivate, "cannot create %s: %v", what, err)
	}
	s.startFirst()
	return s
}

// startFirst starts a server pg-init made. Its port was free when chosen,
// not reserved: another test's server (several end-to-end packages start
// theirs at once) may bind it first. Then the server says so in its log,
// and a new port is tried, twice at most.
func (s *PGServer) startFirst() {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		err := stack("pg-start", s.Dir)
		if err == nil {
			return
		}
		if attempt == 3 || !portTaken(filepath.Join(s.Dir, "postgres.log")) {
			s.t.Fatalf("testenv: %v", err)
		}
		s.movePort(freePorts(s.t, 1)[0])
	}
}

// portTaken reports whether a server's log says its port was in use.
func portTaken(log string) bool {
	b, _ := os.ReadFile(log)
	return bytes.Contains(b, []byte("Address already in use"))
}

// movePort gives a server that is not running another port: a later
// setting in postgresql.conf overrides the one pg-init wrote.
func (s *PGServer) movePort(port int) {
	s.t.Helper()
	conf := filepath.Join(s.Dir, "data", "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fmt.Fprintf(f, "port = %d # the first port was taken before the server bound it\n", port)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(s.Dir, "port"), []byte(strconv.Itoa(port)+"\n"), 0o644)
	}
	if err != nil {
		s.t.Fatalf("testenv: move %s to port %d: %v", s.Dir, port, err)
	}
	s.DSN = strings.Replace(s.DSN, fmt.Sprintf(":%d/", s.Port), fmt.Sprintf(":%d/", port), 1)
	s.Port = port
}

// Start starts the server and waits until it accepts connections.
func (s *PGServer) Start() {
	s.t.Helper()
	if err := stack("pg-start", s.Dir); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
}

// Stop stops the server: mode "fast" (the default when empty) or "immediate"
// (no shutdown checkpoint: crash recovery at the next start).
func (s *PGServer) Stop(mode string) {
	s.t.Helper()
	if mode == "" {
		mode = "fast"
	}
	if err := stack("pg-stop", s.Dir, mode); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
}

// Restart stops the server with mode (see Stop) and starts it again.
func (s *PGServer) Restart(mode string) {
	s.t.Helper()
	s.Stop(mode)
	s.Start()
}

// KafkaServer is a private single-node Kafka (dev/stack kafka-*), or one
// node of a [KafkaCluster], for tests that stop, kill, pause or restart it.
// Its methods fail the test on error, so call them from the test's goroutine.
type KafkaServer struct {
	Brokers []string // its one broker, 127.0.0.1:Port
	Dir     string   // instance folder: server.properties, data/, server.log, pid
	Port    int
	NodeID  int32 // Kafka's node.id: 1 alone, i+1 for a cluster's Node(i)

	t      testing.TB
	down   bool // stopped or killed by us
	paused bool // SIGSTOPped by Pause
}

// StartKafka formats and starts a private Kafka (same settings as the dev
// stack) in a temporary folder; it is killed and removed at cleanup.
func StartKafka(t testing.TB) *KafkaServer {
	t.Helper()
	return StartKafkaWith(t, nil)
}

// StartKafkaWith is StartKafka with broker settings added to (and so
// overriding) its server.properties, e.g.
// "transactional.id.expiration.ms": "20000".
func StartKafkaWith(t testing.TB, props map[string]string) *KafkaServer {
	t.Helper()
	dir := instanceDir(t, "outboxd-kafka-")
	ports := freePorts(t, 2)
	s := &KafkaServer{
		Brokers: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])},
		Dir:     dir,
		Port:    ports[0],
		NodeID:  1,
		t:       t,
	}
	t.Cleanup(func() {
		if err := stack("kafka-stop", dir, "kill"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	if err := stack("kafka-init", dir, strconv.Itoa(ports[0]), strconv.Itoa(ports[1])); err != nil {
		unavailable(t, hintPrivate, "cannot create a private Kafka: %v", err)
	}
	if err := appendProperties(filepath.Join(dir, "server.properties"), props); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s.Start()
	return s
}

// appendProperties appends props to a Java properties file; the last
// occurrence of a key wins.
func appendProperties(path string, props map[string]string) error {
	if len(props) == 0 {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, err := fmt.Fprintf(f, "%s=%s\n", k, props[k]); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// Start starts the broker and waits until it has started and accepts
// connections. A cluster node has then registered with the controller and
// been unfenced; it may still be catching up (see [KafkaCluster.WaitInSync]).
func (s *KafkaServer) Start() {
	s.t.Helper()
	if err := stack("kafka-start", s.Dir); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
	s.down, s.paused = false, false
}

// Stop stops the broker gracefully (SIGTERM, resuming it if paused; SIGKILL
// if it takes too long) and waits until it has exited.
func (s *KafkaServer) Stop() {
	s.t.Helper()
	if err := stack("kafka-stop", s.Dir); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
	s.down, s.paused = true, false
}

// Kill kills the broker with SIGKILL, as a crash would.
func (s *KafkaServer) Kill() {
	s.t.Helper()
	if err := stack("kafka-stop", s.Dir, "kill"); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
	s.down, s.paused = true, false
}

// stack runs dev/stack with args and returns its output in the error.
func stack(args ...string) error {
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("dev/stack: %w", err)
	}
	root, err := FindRepoRoot(wd)
	if err != nil {
		return fmt.Errorf("dev/stack: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "dev", "stack"), args...)
	cmd.WaitDelay = 5 * time.Second // never wait on a server that kept our stdout
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("dev/stack %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// instanceDir makes a temporary folder the postgres user can enter (dev/stack
// chowns a PostgreSQL folder to it when run as root). t.TempDir is no use:
// its parents are private to the current user.
func instanceDir(t testing.TB, prefix string) string {
	t.Helper()
	needServers(t)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dir
}

// freePorts asks the kernel for n distinct free ports on 127.0.0.1.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("testenv: free port: %v", err)
		}
		defer l.Close() // held until all n are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// newPGServer reserves a folder and a port for a private server and stops
// and removes it at cleanup; the caller initialises and starts it.
func newPGServer(t testing.TB, prefix string) *PGServer {
	t.Helper()
	dir := instanceDir(t, prefix)
	port := freePorts(t, 1)[0]
	s := &PGServer{
		DSN:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Dir:  dir,
		Port: port,
		t:    t,
	}
	t.Cleanup(func() {
		if err := stack("pg-stop", dir, "immediate"); err != nil {
			t.Errorf("testenv: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return s
}
