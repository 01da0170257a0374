package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.uber.org/zap/zaptest"
)

func newGroupHandler(t *testing.T, cfg Config, r *rig, done *[]string, sess *fakeSession) *groupHandler {
	cfg.OnDone = func(m *Message, res Result) {
		sess.add(fmt.Sprintf("done %d %s", m.Offset, res.Outcome))
		*done = append(*done, res.Outcome.String())
	}
	r.proc.cfg = cfg
	return &groupHandler{cfg: cfg, proc: r.proc, log: zaptest.NewLogger(t)}
}

// Each offset is marked only after its message is done (OnDone comes first),
// and with CommitInterval 0 committed right after.
func TestConsumeClaimMarksAfterDone(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.CommitInterval = 0
	r := newRig(t, cfg)
	r.h.always[2] = Domain(errors.New("invalid"))
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newGroupHandler(t, cfg, r, &done, sess)

	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, 4)}
	claim.msgs <- msg(10, 1, "a")
	claim.msgs <- msg(11, 2, "a") // poison: dead-lettered, does not block 12
	claim.msgs <- msg(12, 3, "a")
	claim.msgs <- msg(13, 1, "a") // redelivered: duplicate
	close(claim.msgs)
	if err := g.ConsumeClaim(sess, claim); err != nil {
		t.Fatalf("ConsumeClaim: %v", err)
	}
	want := []string{
		"done 10 processed", "mark 11", "commit",
		"done 11 dead-lettered", "mark 12", "commit",
		"done 12 processed", "mark 13", "commit",
		"done 13 duplicate", "mark 14", "commit",
	}
	if got := sess.events(); !slices.Equal(got, want) {
		t.Fatalf("events\n%q\nwant\n%q", got, want)
	}
	st := r.proc.stats.snapshot()
	if st.Done != 4 || st.Processed != 2 || st.Duplicates != 1 || st.DeadLettered != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A message whose dead-letter publish fails is not marked; the claim stops
// with the error, the messages done before it are committed, and nothing
// after it is touched.
func TestConsumeClaimDeadLetterFailureStops(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.CommitInterval = time.Hour
	r := newRig(t, cfg)
	r.h.always[2] = Domain(errors.New("invalid"))
	r.prod.err = errors.New("unknown topic")
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newGroupHandler(t, cfg, r, &done, sess)

	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, 3)}
	claim.msgs <- msg(10, 1, "a")
	claim.msgs <- msg(11, 2, "a")
	claim.msgs <- msg(12, 3, "a")
	err := g.ConsumeClaim(sess, claim)
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(g.fatalErr(), ErrDeadLetter) {
		t.Fatalf("ConsumeClaim = %v, fatal = %v; want the dead-letter failure", err, g.fatalErr())
	}
	want := []string{"done 10 processed", "mark 11", "commit"}
	if got := sess.events(); !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if r.h.calls[3] != 0 {
		t.Fatal("the message after the failed one was processed")
	}
}

// Marks are committed on the interval and when the claim ends.
func TestConsumeClaimCommitInterval(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.CommitInterval = 20 * time.Millisecond
	r := newRig(t, cfg)
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newGroupHandler(t, cfg, r, &done, sess)

	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage)}
	errc := make(chan error, 1)
	go func() { errc <- g.ConsumeClaim(sess, claim) }()
	claim.msgs <- msg(0, 1, "a")
	claim.msgs <- msg(1, 2, "a")
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(sess.events(), "commit") {
		if time.Now().After(deadline) {
			t.Fatalf("no commit on the interval: %q", sess.events())
		}
		time.Sleep(5 * time.Millisecond)
	}
	claim.msgs <- msg(2, 3, "a")
	close(claim.msgs)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ev := sess.events()
	if ev[len(ev)-1] != "commit" || ev[len(ev)-2] != "mark 3" {
		t.Fatalf("events %q: want the last mark committed when the claim ends", ev)
	}
}

// When the session ends mid-retry the message is neither marked nor
// dead-lettered, and the claim returns without error.
func TestConsumeClaimSessionEndsMidRetry(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	r := newRig(t, cfg)
	r.proc.sleep = sleepCtx
	r.h.always[1] = errFlaky
	ctx, cancel := context.WithCancel(context.Background())
	sess := &fakeSession{ctx: ctx}
	var done []string
	g := newGroupHandler(t, cfg, r, &done, sess)
	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, 1)}
	claim.msgs <- msg(0, 1, "a")
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := g.ConsumeClaim(sess, claim); err != nil {
		t.Fatalf("ConsumeClaim: %v", err)
	}
	if ev := sess.events(); len(ev) != 0 || len(r.prod.sent) != 0 || g.fatalErr() != nil {
		t.Fatalf("events %q, dead-lettered %d, fatal %v; want nothing", ev, len(r.prod.sent), g.fatalErr())
	}
}
