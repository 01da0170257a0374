package main

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// TestQuickNetworkBenchmark runs make bench-network's matrix shrunk (two
// round trips, one load, a tiny drain, a two-step hot aggregate search) with
// a private broker behind an in-process proxy, and checks that every cell,
// bare producer, hot search and drain is present and complete. It never
// asserts timings.
func TestQuickNetworkBenchmark(t *testing.T) {
	pg := testenv.Postgres(t) // fails under CI=true when the stack is missing
	k := testenv.StartKafkaBehindProxy(t, 0)
	st := stack{AdminDSN: pg.AdminDSN, Brokers: k.Server.Brokers, PubBrokers: k.Brokers()}
	bin, self := buildChildren(t, true)
	p := networkQuickPlan()
	setRTT := func(d time.Duration) error { k.SetRTT(d); return nil }
	rep, err := runner{stack: st, bin: bin, self: self, plan: p, logf: t.Logf, setRTT: setRTT}.network(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := rep.write(out); err != nil {
		t.Fatal(err)
	}
	if k.Proxy.Accepted() == 0 {
		t.Error("nothing went through the proxy")
	}
	b, err := os.ReadFile(filepath.Join(out, "network.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got networkReport
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("network.json: %v", err)
	}
	if len(got.Floors) != len(p.RTTs) {
		t.Errorf("%d floors, want one per RTT (%d)", len(got.Floors), len(p.RTTs))
	}
	for _, rtt := range p.RTTs {
		name := rttName(ms(rtt))
		for _, l := range p.Loads {
			for _, s := range p.Sources {
				cs := got.cells(s.Name, l, ms(rtt))
				if len(cs) != max(1, p.Repeats) {
					t.Errorf("%s at %s, %s: %d rounds, want %d: %v", s.Name, l, name, len(cs), max(1, p.Repeats), got.errors())
				}
				for _, c := range cs {
					if c.Written == 0 || c.Received != c.Written || c.Missing != 0 || c.Duplicates != 0 {
						t.Errorf("%s at %s, %s: written %d received %d missing %d dup %d", s.Name, l, name, c.Written, c.Received, c.Missing, c.Duplicates)
					}
					if !(0 < c.P50Ms && c.P50Ms <= c.P99Ms && c.P99Ms <= c.MaxMs) || c.CPUShares == nil {
						t.Errorf("%s at %s, %s: p50 %v p99 %v max %v, shares %v", s.Name, l, name, c.P50Ms, c.P99Ms, c.MaxMs, c.CPUShares)
					}
					if wantBare := !s.Poll && !s.Debezium; wantBare != (c.Bare != nil) || (c.Bare != nil && (c.Bare.Records == 0 || c.Bare.P50Ms <= 0)) {
						t.Errorf("%s at %s, %s: bare producer %+v, want one beside every CDC cell", s.Name, l, name, c.Bare)
					}
				}
			}
		}
		h := got.hotAt(ms(rtt))
		// Whether a step kept up is how fast, not whether it ran: only
		// that every step ran and delivered is checked.
		if h == nil || len(h.Steps) == 0 {
			t.Errorf("hot aggregate at %s: %+v, want its steps", name, h)
		} else {
			for _, c := range h.Steps {
				if c.Written == 0 || c.Received != c.Written || c.P50Ms <= 0 || c.Source != "cdc-hot" {
					t.Errorf("hot aggregate at %s, %s: written %d received %d", name, c.Load, c.Written, c.Received)
				}
			}
		}
		for _, s := range p.Sources {
			if s.Poll || s.Debezium {
				continue
			}
			var found bool
			for _, to := range got.Takeover {
				if to.Source == s.Name && to.RTTMs == ms(rtt) {
					found = true
					if to.Err != "" || to.StartupSeconds <= 0 || to.TakeoverSeconds <= 0 {
						t.Errorf("takeover %s at %s incomplete: %+v", s.Name, name, to)
					}
				}
			}
			if !found {
				t.Errorf("takeover %s at %s missing", s.Name, name)
			}
		}
		for _, src := range append([]string{ceilingName}, names(p.DrainSources)...) {
			d := got.drain(src, ms(rtt))
			if d == nil {
				t.Errorf("drain %s at %s missing or failed: %v", src, name, got.errors())
				continue
			}
			if d.Rows != p.DrainRows || d.EventsPerSec <= 0 || d.CPUSeconds <= 0 {
				t.Errorf("drain %s at %s incomplete: %+v", src, name, *d)
			}
			// Present, not > 0: a quick drain's walsender can use less
			// than the 10 ms /proc counts in.
			if _, ok := d.CPUShares["walsender"]; src != ceilingName && !ok {
				t.Errorf("drain %s at %s: cores %v, want the walsender's (or poll backends') share", src, name, d.CPUShares)
			}
		}
	}
	if len(got.Targets) == 0 {
		t.Error("no targets evaluated")
	}
	md, err := os.ReadFile(filepath.Join(out, "network.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"## Latency", "## Hot aggregate", "## Start-up and standby takeover", "## Backlog drain", "## Targets", "network.png", "RTT 1 ms", "loopback"} {
		if !bytes.Contains(md, []byte(s)) {
			t.Errorf("network.md does not mention %q", s)
		}
	}
	if bytes.Contains(md, []byte("FAILED")) {
		t.Errorf("network.md reports failures:\n%s", md)
	}
	f, err := os.Open(filepath.Join(out, "network.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("network.png: %v", err)
	}
}
