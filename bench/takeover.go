package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
)

// takeoverResult is one standby takeover at one round trip: an outboxd
// publishing to a topic created a moment before, a second one waiting on
// the same slot as a standby, the first killed (SIGKILL), and the time from
// the kill to the first row written after it arriving in Kafka.
type takeoverResult struct {
	RTTMs  float64 `json:"rtt_ms"`
	Source string  `json:"source"`
	// StartupSeconds is the active one's start → its first record in the
	// new topic.
	StartupSeconds float64 `json:"startup_seconds"`
	// TakeoverSeconds is the kill → the first row written after it, in
	// Kafka (published by the standby).
	TakeoverSeconds float64 `json:"takeover_seconds"`
	Err             string  `json:"error,omitempty"`
}

// takeovers runs one takeover per CDC source of the plan at the current
// round trip.
func (r *runner) takeovers(ctx context.Context) []takeoverResult {
	var out []takeoverResult
	for _, s := range r.plan.Sources {
		if s.Poll || s.Debezium {
			continue
		}
		t := r.takeover(ctx, s)
		r.logf("  %-14s start-up %.2f s, takeover %.2f s %s", s.Name, t.StartupSeconds, t.TakeoverSeconds, t.Err)
		out = append(out, t)
	}
	return out
}

func (r *runner) takeover(ctx context.Context, s source) (res takeoverResult) {
	res = takeoverResult{RTTMs: ms(r.rtt), Source: s.Name}
	fail := func(err error) takeoverResult { res.Err = err.Error(); return res }
	db, topic, conn, cleanup, err := r.cellEnv(ctx, "takeover")
	if err != nil {
		return fail(err)
	}
	defer cleanup()
	cons, err := startConsumer(r.stack, topic, clock{base: time.Now()})
	if err != nil {
		return fail(err)
	}
	defer cons.close()
	insert := func() (int64, error) {
		var id int64
		err := conn.QueryRow(ctx, `INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('takeover', $1, '{}') RETURNING id`, topic).Scan(&id)
		return id, err
	}

	name := testenv.UniqueName("takeover")
	started := time.Now()
	active, done, _, err := r.launch(db, name, name, s)
	if err != nil {
		return fail(err)
	}
	defer done()
	defer active.Terminate(10 * time.Second)
	// Rows until the first arrives (rows before the slot exists are not in
	// it), as the latency cells' start-up.
	for deadline := started.Add(120 * time.Second); cons.count() == 0; {
		if active.Exited() || time.Now().After(deadline) {
			return fail(fmt.Errorf("no record within 120s of start: %s", active.Tail(5)))
		}
		if slotActive(ctx, conn, name) {
			if _, err := insert(); err != nil {
				return fail(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.StartupSeconds = time.Since(started).Seconds()

	standby, doneB, metrics, err := r.launch(db, name, name, s)
	if err != nil {
		return fail(err)
	}
	defer doneB()
	defer standby.Terminate(10 * time.Second)
	if err := waitReady(metrics, "standby", 60*time.Second); err != nil {
		return fail(fmt.Errorf("standby: %w: %s", err, standby.Tail(5)))
	}
	killed := time.Now()
	if err := active.Kill(); err != nil {
		return fail(err)
	}
	id, err := insert()
	if err != nil {
		return fail(err)
	}
	cons.countFrom(id)
	if !cons.waitForFrom(1, 120*time.Second) {
		return fail(fmt.Errorf("the row written after the kill not in Kafka within 120s: %s", standby.Tail(5)))
	}
	res.TakeoverSeconds = time.Since(killed).Seconds()
	return res
}

// waitReady waits until outboxd's /readyz at addr answers 200 with a body
// containing want.
func waitReady(addr, want string, timeout time.Duration) error {
	c := http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(timeout); ; {
		if resp, err := c.Get("http://" + addr + "/readyz"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), want) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz did not say %q within %s", want, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// takeoverMarkdown is the report's start-up and takeover table.
func (n *networkReport) takeoverMarkdown(p func(string, ...any)) {
	if len(n.Takeover) == 0 {
		return
	}
	p("\n## Start-up and standby takeover\n\nStart-up: outboxd's start → its first record in a topic created a moment before. Takeover: the active outboxd killed (SIGKILL) while a second one waits on the slot as a standby → the first row written after the kill in Kafka.\n\n| RTT | source | start-up s | takeover s |\n|---|---|--:|--:|\n")
	for _, t := range n.Takeover {
		if t.Err != "" {
			p("| %s | %s | FAILED: %s ||\n", rttName(t.RTTMs), t.Source, mdEscape(t.Err))
			continue
		}
		p("| %s | %s | %.2f | %.2f |\n", rttName(t.RTTMs), t.Source, t.StartupSeconds, t.TakeoverSeconds)
	}
}

// evaluateTakeover adds the start-up and takeover targets (≤ 1 s at the
// longest round trip measured, 5 ms in the full plan).
func (n *networkReport) evaluateTakeover(add func(goal, measured string, met bool)) {
	var far float64
	for _, t := range n.Takeover {
		far = max(far, t.RTTMs)
	}
	for _, t := range n.Takeover {
		if t.RTTMs != far || t.Err != "" {
			continue
		}
		add(fmt.Sprintf("%s: %s start-up to first event (new topic) ≤ 1 s", rttName(far), t.Source), fmt.Sprintf("%.2f s", t.StartupSeconds), t.StartupSeconds <= 1)
		add(fmt.Sprintf("%s: %s standby takeover ≤ 1 s", rttName(far), t.Source), fmt.Sprintf("%.2f s", t.TakeoverSeconds), t.TakeoverSeconds <= 1)
	}
}
