package testproc

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcReaders(t *testing.T) {
	// Burn a little CPU and hold some memory, so both readings are above 0.
	buf := make([]byte, 8<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	rss, err := PeakRSS(os.Getpid())
	if err != nil || rss < int64(len(buf)) {
		t.Fatalf("PeakRSS = %d, %v; want at least %d", rss, err, len(buf))
	}
	cpu, err := CPUTime(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Fatalf("CPUTime = %s, %v; want > 0", cpu, err)
	}
	if _, err := PeakRSS(-1); err == nil {
		t.Fatal("PeakRSS(-1): no error")
	}
}

func TestLaunchAndStart(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("no /bin/sh")
	}
	t.Setenv("OUTBOXD_SECRET", "x")
	code, out := Run(t, 10*time.Second, sh, "-c", `echo "env:${OUTBOXD_SECRET}${EXTRA}"; exit 3`)
	if code != 3 || strings.TrimSpace(out) != "env:" {
		t.Fatalf("Run = %d %q, want 3 \"env:\"", code, out)
	}

	p, err := Launch(sh, []string{"-c", `echo "extra:$EXTRA"; echo ready; exec sleep 60`}, "EXTRA=1")
	if err != nil {
		t.Fatal(err)
	}
	if p.ExitCode() != -1 || p.State() != nil {
		t.Fatal("a running process has an exit code")
	}
	p.t = t // WaitOutput, for this test only
	p.WaitOutput("ready", 10*time.Second)
	if code := p.Terminate(10 * time.Second); code != -1 || !p.Exited() {
		t.Fatalf("Terminate = %d, want -1 (killed by SIGTERM)", code)
	}
	if p.Tail(1) != "ready" || !strings.HasPrefix(p.Output(), "extra:1\n") {
		t.Fatalf("output %q", p.Output())
	}

	q := Start(t, sh, "-c", "exec sleep 60")
	if err := q.Kill(); err != nil {
		t.Fatal(err)
	}
	if code := q.Wait(10 * time.Second); code != -1 {
		t.Fatalf("exit code after SIGKILL = %d", code)
	}
	if ws, ok := q.State().Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("state %v", q.State())
	}
}
