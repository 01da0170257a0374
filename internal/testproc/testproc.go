// Package testproc builds the repo's commands and runs them as real
// processes, so a crash can be a real exit, a stop a real signal and a cost
// a reading of /proc. It is the one process runner of the repo: the tests of
// cmd/outboxd and of the examples start their processes with Start, the
// benchmark (a program, with no testing.TB) with Launch.
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
	return build(true, dir, pkgs)
}

// BuildNoRace is Build without the race detector, for measurements that
// want the real speed.
func BuildNoRace(dir string, pkgs ...string) (map[string]string, error) {
	return build(false, dir, pkgs)
}

func build(race bool, dir string, pkgs []string) (map[string]string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	args := []string{"build"}
	if race {
		args = append(args, "-race")
	}
	args = append(append(args, "-o", dir+string(filepath.Separator)), pkgs...)
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

// CleanEnv is this process's environment without OUTBOXD_* and DEMO_*
// settings, so that only a command's flags count, plus extra (KEY=value).
func CleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") && !strings.HasPrefix(kv, "DEMO_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// maxOutput is how much of a process's output a Buffer keeps (the start);
// no test comes near it, and a long benchmark run cannot grow without bound.
const maxOutput = 64 << 20

// Buffer collects a process's output; it is safe for concurrent use.
type Buffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	dropped int
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len()+len(p) > maxOutput {
		s.dropped += len(p)
		return len(p), nil
	}
	return s.b.Write(p)
}

// String is the output so far, with a note at the end if some was dropped.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped > 0 {
		return fmt.Sprintf("%s\n[testproc: %d more bytes of output not kept]\n", s.b.String(), s.dropped)
	}
	return s.b.String()
}

// Proc is one running command.
type Proc struct {
	t     testing.TB // nil when started by Launch
	name  string
	args  []string
	cmd   *exec.Cmd
	out   *Buffer
	done  chan struct{}
	state *os.ProcessState // set before done is closed
}

// Launch starts bin with args in CleanEnv(env...), its stdout and stderr
// collected. It takes no testing.TB: the methods that fail a test (Wait,
// Stop, WaitOutput) are for processes from Start only.
func Launch(bin string, args []string, env ...string) (*Proc, error) {
	p := &Proc{name: filepath.Base(bin), args: args, out: &Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = CleanEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	return p, nil
}

// Start is Launch for a test: it fails the test if bin does not start,
// kills the process at cleanup if still running, and logs its output if the
// test failed.
func Start(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	return StartEnv(t, nil, bin, args...)
}

// StartEnv is Start with extra environment variables (KEY=value).
func StartEnv(t testing.TB, env []string, bin string, args ...string) *Proc {
	t.Helper()
	p, err := Launch(bin, args, env...)
	if err != nil {
		t.Fatal(err)
	}
	p.t = t
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s (pid %d) %v output:\n%s", p.name, p.PID(), p.args, p.out.String())
		}
	})
	return p
}

// Run runs bin to completion and returns its exit code and output.
func Run(t testing.TB, timeout time.Duration, bin string, args ...string) (int, string) {
	t.Helper()
	p := Start(t, bin, args...)
	code := p.Wait(timeout)
	return code, p.Output()
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Output is what the process printed so far (stdout and stderr).
func (p *Proc) Output() string { return p.out.String() }

// Tail is the last n lines of the output.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode is the exit code once the process has exited: -1 while it runs
// or if a signal ended it.
func (p *Proc) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.state.ExitCode()
}

// State is the exited process's state (resource usage included), nil while
// it runs.
func (p *Proc) State() *os.ProcessState {
	if !p.Exited() {
		return nil
	}
	return p.state
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL (a crash, no cleanup in the process); it does not wait.
func (p *Proc) Kill() error { return p.Signal(syscall.SIGKILL) }

// Terminate sends SIGTERM, waits for the exit (SIGKILL after timeout) and
// returns the exit code (-1 when killed). It fails no test, so it serves
// Launch as well.
func (p *Proc) Terminate(timeout time.Duration) int {
	if !p.Exited() {
		_ = p.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.Kill()
			<-p.done
		}
	}
	return p.ExitCode()
}

// Wait waits for the process to exit and returns its exit code; it fails
// the test after timeout.
func (p *Proc) Wait(timeout time.Duration) int {
	p.tb().Helper()
	select {
	case <-p.done:
		return p.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.name, timeout)
		return -1
	}
}

// Stop sends SIGTERM and returns the exit code; it fails the test if the
// process does not exit within timeout.
func (p *Proc) Stop(timeout time.Duration) int {
	p.tb().Helper()
	_ = p.Signal(syscall.SIGTERM)
	return p.Wait(timeout)
}

// WaitOutput waits until the output contains s; it fails the test if the
// process exits first or timeout passes.
func (p *Proc) WaitOutput(s string, timeout time.Duration) {
	p.tb().Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), s) {
		if p.Exited() {
			p.t.Fatalf("%s exited (%d) before printing %q", p.name, p.ExitCode(), s)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not print %q within %s", p.name, s, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Proc) tb() testing.TB {
	if p.t == nil {
		panic("testproc: " + p.name + " was started by Launch; Wait, Stop and WaitOutput need Start")
	}
	return p.t
}
