// Package testproc builds the repo's commands and runs them as real
// processes in tests, so a crash can be a real exit and a stop a real
// signal (the approach of cmd/outboxd's harness_test.go).
package testproc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the packages (paths relative to the repo root, such as
// "./cmd/outboxd") with the race detector into dir and returns the binary
// paths by base name. It takes no testing.TB, so TestMain can call it once
// for all the tests of a package.
func Build(dir string, pkgs ...string) (map[string]string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	args := append([]string{"build", "-race", "-o", dir + string(filepath.Separator)}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		bins[filepath.Base(p)] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// repoRoot is the folder holding go.mod, from the working directory up.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}

// Buffer collects a process's output.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Proc is one running command.
type Proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *Buffer
	done chan struct{}
	code int
}

// Start runs bin with args; its environment has no OUTBOXD_* or DEMO_*
// settings, so only the flags count. It is killed at cleanup if still
// running, and its output is logged if the test failed.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{t: t, name: filepath.Base(bin), out: &Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "DEMO_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s %v output:\n%s", p.name, args, p.out.String())
		}
	})
	return p
}

// Output is what the process printed so far (stdout and stderr).
func (p *Proc) Output() string { return p.out.String() }

// Wait waits for the process to exit and returns its exit code.
func (p *Proc) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}

// Stop sends SIGTERM and returns the exit code.
func (p *Proc) Stop(timeout time.Duration) int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.Wait(timeout)
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitOutput waits until the output contains s; it fails the test if the
// process exits first or timeout passes.
func (p *Proc) WaitOutput(s string, timeout time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), s) {
		if p.Exited() {
			p.t.Fatalf("%s exited (%d) before printing %q", p.name, p.code, s)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not print %q within %s", p.name, s, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Run runs bin to completion and returns its exit code and output.
func Run(t testing.TB, timeout time.Duration, bin string, args ...string) (int, string) {
	t.Helper()
	p := Start(t, bin, args...)
	code := p.Wait(timeout)
	return code, p.Output()
}
