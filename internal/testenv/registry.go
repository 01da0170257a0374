package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const registryURLVar = "OUTBOXD_SCHEMA_REGISTRY_URL"

const hintRegistry = "run `dev/stack registry-deps` (it builds Apicurio Registry with Maven once), or set " + registryURLVar + " to a Confluent-compatible registry"

// RegistryServer is a Schema Registry with the Confluent API: Apicurio
// Registry 2.4.2 run by `dev/stack registry-start` (storage in memory), or
// the one OUTBOXD_SCHEMA_REGISTRY_URL names.
type RegistryServer struct {
	// URL is the Confluent-compatible base URL (Apicurio's
	// http://127.0.0.1:PORT/apis/ccompat/v7).
	URL  string
	Dir  string // instance folder ("" for OUTBOXD_SCHEMA_REGISTRY_URL's)
	Port int

	t testing.TB
}

// The test package's shared registry: started by the first Registry call,
// stopped by StopRegistry (from the package's TestMain).
var shared struct {
	sync.Mutex
	srv *RegistryServer
	err error
}

// Registry returns the test package's Schema Registry, started on first
// use and shared by its tests (each uses subjects of its own topics). A
// package that calls it stops it in TestMain:
//
//	func TestMain(m *testing.M) { code := m.Run(); testenv.StopRegistry(); os.Exit(code) }
//
// When it cannot start, the test is skipped, or fails under CI=true.
func Registry(t testing.TB) *RegistryServer {
	t.Helper()
	needServers(t)
	if u := setting(registryURLVar); u != "" {
		return &RegistryServer{URL: strings.TrimRight(u, "/"), t: t}
	}
	shared.Lock()
	defer shared.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = startRegistry()
	}
	if shared.err != nil {
		unavailable(t, hintRegistry, "cannot start a Schema Registry: %v", shared.err)
	}
	return shared.srv
}

// StopRegistry stops the package's shared registry, if one was started.
func StopRegistry() {
	shared.Lock()
	defer shared.Unlock()
	if shared.srv != nil {
		_ = stack("registry-stop", shared.srv.Dir)
		_ = os.RemoveAll(shared.srv.Dir)
		shared.srv = nil
	}
}

// StartRegistry starts a private registry for one test (one that stops
// and restarts it); it is stopped and removed at cleanup. Its schemas live
// in memory: a restart forgets them.
func StartRegistry(t testing.TB) *RegistryServer {
	t.Helper()
	needServers(t)
	s, err := startRegistry()
	if s != nil {
		t.Cleanup(func() {
			if err := stack("registry-stop", s.Dir); err != nil {
				t.Errorf("testenv: %v", err)
			}
			_ = os.RemoveAll(s.Dir)
		})
	}
	if err != nil {
		unavailable(t, hintRegistry, "cannot start a Schema Registry: %v", err)
	}
	s.t = t
	return s
}

func startRegistry() (*RegistryServer, error) {
	dir, err := os.MkdirTemp("", "outboxd-registry-")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &RegistryServer{Dir: dir, Port: port}
	if err := stack("registry-start", dir, strconv.Itoa(port)); err != nil {
		return s, err
	}
	u, err := os.ReadFile(filepath.Join(dir, "url"))
	if err != nil {
		return s, fmt.Errorf("the registry wrote no url: %w", err)
	}
	s.URL = strings.TrimSpace(string(u))
	return s, nil
}

// Stop stops a private registry (StartRegistry's).
func (s *RegistryServer) Stop() {
	s.t.Helper()
	if err := stack("registry-stop", s.Dir); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped private registry again on the same port.
func (s *RegistryServer) Start() {
	s.t.Helper()
	if err := stack("registry-start", s.Dir, strconv.Itoa(s.Port)); err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
}

// FreePort asks the kernel for a free port on 127.0.0.1 (free a moment ago).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
