package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"
)

// newBatchGroupHandler is newGroupHandler wired as NewBatch wires it: the
// script handler is the BatchHandler, and the one-at-a-time path calls it
// with one-element slices. Every committed transaction appears in the
// session's log as "tx <offsets>".
func newBatchGroupHandler(t *testing.T, cfg Config, r *rig, done *[]string, sess *fakeSession) *groupHandler {
	r.proc.bh = r.h
	r.proc.h = batchOfOne{r.h}
	r.store.onCommit = func(offs []int64) { sess.add("tx " + strings.Trim(fmt.Sprint(offs), "[]")) }
	return newGroupHandler(t, cfg, r, done, sess)
}

func batchConfig(size int) Config {
	cfg := testConfig()
	cfg.BatchSize = size
	cfg.CommitInterval = 0
	return cfg
}

// claimOf is a closed claim holding cms, all buffered.
func claimOf(cms ...*sarama.ConsumerMessage) *fakeClaim {
	c := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, len(cms))}
	for _, cm := range cms {
		c.msgs <- cm
	}
	close(c.msgs)
	return c
}

func checkEvents(t *testing.T, sess *fakeSession, want ...string) {
	t.Helper()
	if got := sess.events(); !slices.Equal(got, want) {
		t.Fatalf("events\n%q\nwant\n%q", got, want)
	}
}

// One transaction per batch records all its ids; a duplicate inside the
// batch and one of an earlier batch are skipped and counted; the handler
// gets the new messages in offset order; offsets are marked after the
// transaction committed, and committed once per batch.
func TestBatchDedupAndMarks(t *testing.T) {
	t.Parallel()
	r := newRig(t, batchConfig(3))
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, batchConfig(3), r, &done, sess)
	claim := claimOf(
		msg(10, 1, "a"), msg(11, 2, "b"), msg(12, 1, "a"), // 12: duplicate inside the batch
		msg(13, 2, "b"), msg(14, 3, "c"), // 13: duplicate of the first batch
	)
	if err := g.ConsumeClaim(sess, claim); err != nil {
		t.Fatalf("ConsumeClaim: %v", err)
	}
	checkEvents(t, sess,
		"tx 10 11 12", "done 10 processed", "mark 11", "done 11 processed", "mark 12", "done 12 duplicate", "mark 13", "commit",
		"tx 13 14", "done 13 duplicate", "mark 14", "done 14 processed", "mark 15", "commit",
	)
	if want := [][]int64{{1, 2}, {3}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v", r.h.batches, want)
	}
	if r.store.dups[1] != 1 || r.store.dups[2] != 1 || r.store.attempts != 0 {
		t.Fatalf("duplicates %v, single attempts %d; want 1 for ids 1 and 2, no single attempt", r.store.dups, r.store.attempts)
	}
	st := r.proc.stats.snapshot()
	if st.Done != 5 || st.Processed != 3 || st.Duplicates != 2 || st.Batches != 2 || st.BatchFallbacks != 0 || st.InFlight != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A batch that fails, whatever the cause, is rolled back and redone one
// message at a time: only the failing message is retried or dead-lettered,
// its neighbours are processed once, and every offset is marked in order
// after its own transaction.
func TestBatchFailureFallsBackOneAtATime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		setup    func(r *rig)
		outcome  string // of outbox id 3
		attempts int    // of outbox id 3
		class    string // of its dead-letter record, if any
	}{
		{name: "domain error", outcome: "dead-lettered", attempts: 1, class: ClassDomain,
			setup: func(r *rig) { r.h.always[3] = Domain(errors.New("invalid transition")) }},
		{name: "panic", outcome: "dead-lettered", attempts: 1, class: ClassDomain,
			setup: func(r *rig) { r.h.panics[3] = true }},
		{name: "transient exhausted", outcome: "dead-lettered", attempts: 2, class: ClassTransient,
			setup: func(r *rig) { r.h.always[3] = errFlaky }},
		{name: "transient once", outcome: "processed", attempts: 1,
			setup: func(r *rig) { r.h.script[3] = []error{errFlaky} }}, // the failed batch call is not an attempt
		{name: "database error", outcome: "processed", attempts: 1,
			setup: func(r *rig) { r.store.dbErrs = []error{errors.New("connection reset")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := batchConfig(10)
			cfg.MaxRetries = 1
			r := newRig(t, cfg)
			tc.setup(r)
			sess := &fakeSession{ctx: context.Background()}
			var done []string
			g := newBatchGroupHandler(t, cfg, r, &done, sess)
			if err := g.ConsumeClaim(sess, claimOf(msg(10, 1, "a"), msg(11, 2, "a"), msg(12, 3, "a"), msg(13, 4, "a"), msg(14, 5, "a"))); err != nil {
				t.Fatalf("ConsumeClaim: %v", err)
			}
			var want []string
			for i, off := range []int64{10, 11, 12, 13, 14} {
				outcome := "processed"
				if i == 2 {
					outcome = tc.outcome
				}
				if outcome == "processed" {
					want = append(want, fmt.Sprintf("tx %d", off))
				}
				want = append(want, fmt.Sprintf("done %d %s", off, outcome), fmt.Sprintf("mark %d", off+1), "commit")
			}
			checkEvents(t, sess, want...)
			for _, b := range r.h.batches[1:] {
				if len(b) != 1 {
					t.Fatalf("handler batches %v: after the failed batch, want one message per call", r.h.batches)
				}
			}
			if tc.class == "" {
				if len(r.prod.sent) != 0 {
					t.Fatalf("%d dead-letter records, want none", len(r.prod.sent))
				}
			} else {
				if len(r.prod.sent) != 1 {
					t.Fatalf("%d dead-letter records, want 1", len(r.prod.sent))
				}
				d := r.prod.sent[0]
				if header(d, HeaderOutboxID) != "3" || header(d, HeaderErrorClass) != tc.class || header(d, HeaderAttempts) != fmt.Sprint(tc.attempts) {
					t.Fatalf("dead-letter record: outbox id %s, class %s, attempts %s; want 3, %s, %d",
						header(d, HeaderOutboxID), header(d, HeaderErrorClass), header(d, HeaderAttempts), tc.class, tc.attempts)
				}
			}
			for _, id := range []int64{1, 2, 4, 5} {
				if !r.store.committed[id] {
					t.Errorf("outbox id %d not processed", id)
				}
			}
			st := r.proc.stats.snapshot()
			if st.Done != 5 || st.Batches != 0 || st.BatchFallbacks != 1 {
				t.Fatalf("stats %+v, want 5 done, no batch committed, 1 fallback", st)
			}
		})
	}
}

// Messages without a valid outbox id split a batch: they are dead-lettered
// alone, in their place, and the runs around them are batches (a run of one
// goes the one-at-a-time way).
func TestBatchInvalidOutboxIDSplitsBatch(t *testing.T) {
	t.Parallel()
	r := newRig(t, batchConfig(10))
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, batchConfig(10), r, &done, sess)
	if err := g.ConsumeClaim(sess, claimOf(msg(10, 1, "a"), msg(11, 0, "a"), msg(12, 2, "a"), msg(13, 3, "a"))); err != nil {
		t.Fatalf("ConsumeClaim: %v", err)
	}
	checkEvents(t, sess,
		"tx 10", "done 10 processed", "mark 11", "commit",
		"done 11 dead-lettered", "mark 12", "commit",
		"tx 12 13", "done 12 processed", "mark 13", "done 13 processed", "mark 14", "commit",
	)
	if want := [][]int64{{1}, {2, 3}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v", r.h.batches, want)
	}
	if r.store.batches != 1 || len(r.prod.sent) != 1 {
		t.Fatalf("%d batch transactions, %d dead-letter records; want 1, 1", r.store.batches, len(r.prod.sent))
	}
}

// When a message of a failed batch cannot be done (dead-letter publish
// failed), the claim stops there: the messages before it are marked and
// committed, nothing after it is marked or processed on its own.
func TestBatchDeadLetterFailureStops(t *testing.T) {
	t.Parallel()
	cfg := batchConfig(10)
	cfg.CommitInterval = time.Hour
	r := newRig(t, cfg)
	r.h.always[2] = Domain(errors.New("invalid"))
	r.prod.err = errors.New("unknown topic")
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, cfg, r, &done, sess)
	err := g.ConsumeClaim(sess, claimOf(msg(10, 1, "a"), msg(11, 2, "a"), msg(12, 3, "a")))
	if !errors.Is(err, ErrDeadLetter) || !errors.Is(g.fatalErr(), ErrDeadLetter) {
		t.Fatalf("ConsumeClaim = %v, fatal = %v; want the dead-letter failure", err, g.fatalErr())
	}
	checkEvents(t, sess, "tx 10", "done 10 processed", "mark 11", "commit")
	if r.store.committed[3] || r.h.calls[3] != 0 {
		t.Fatalf("outbox id 3: committed %v, handler calls %d; want untouched (the batch stopped at id 2)", r.store.committed[3], r.h.calls[3])
	}
}

// When the session ends during a batch, nothing of it is marked, retried one
// at a time or dead-lettered.
func TestBatchSessionEnds(t *testing.T) {
	t.Parallel()
	r := newRig(t, batchConfig(10))
	ctx, cancel := context.WithCancel(context.Background())
	sess := &fakeSession{ctx: ctx}
	var done []string
	g := newBatchGroupHandler(t, batchConfig(10), r, &done, sess)
	r.proc.bh = BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, ms []*Message) error {
		cancel() // rebalance
		return errFlaky
	})
	if err := g.ConsumeClaim(sess, claimOf(msg(10, 1, "a"), msg(11, 2, "a"))); err != nil {
		t.Fatalf("ConsumeClaim: %v", err)
	}
	if ev := sess.events(); len(ev) != 0 || len(r.prod.sent) != 0 || r.store.attempts != 0 || g.fatalErr() != nil {
		t.Fatalf("events %q, dead-lettered %d, single attempts %d, fatal %v; want nothing", ev, len(r.prod.sent), r.store.attempts, g.fatalErr())
	}
}

// runClaim runs ConsumeClaim in the background; wait returns its error.
func runClaim(t *testing.T, g *groupHandler, sess *fakeSession, claim *fakeClaim) (wait func() error) {
	errc := make(chan error, 1)
	go func() { errc <- g.ConsumeClaim(sess, claim) }()
	return func() error {
		select {
		case err := <-errc:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("ConsumeClaim did not return")
			return nil
		}
	}
}

func waitForEvent(t *testing.T, sess *fakeSession, e string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(sess.events(), e) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 10s: %q", e, sess.events())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// With BatchWait 0 a batch is what is buffered: the buffered messages go
// together, and a lone message is processed at once, without waiting for
// more.
func TestBatchWaitZeroDoesNotWait(t *testing.T) {
	t.Parallel()
	cfg := batchConfig(100)
	r := newRig(t, cfg)
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, cfg, r, &done, sess)
	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage, 10)}
	claim.msgs <- msg(10, 1, "a")
	claim.msgs <- msg(11, 2, "a")
	claim.msgs <- msg(12, 3, "a")
	wait := runClaim(t, g, sess, claim)
	waitForEvent(t, sess, "mark 13")
	claim.msgs <- msg(13, 4, "a")
	waitForEvent(t, sess, "mark 14") // alone, with 96 places left in its batch
	close(claim.msgs)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{1, 2, 3}, {4}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v", r.h.batches, want)
	}
}

// With BatchWait > 0 a batch waits for more messages, up to BatchSize (then
// it goes at once) or BatchWait.
func TestBatchWaitFillsBatch(t *testing.T) {
	t.Parallel()
	cfg := batchConfig(3)
	cfg.BatchWait = time.Hour
	r := newRig(t, cfg)
	sess := &fakeSession{ctx: context.Background()}
	var done []string
	g := newBatchGroupHandler(t, cfg, r, &done, sess)
	claim := &fakeClaim{msgs: make(chan *sarama.ConsumerMessage)} // nothing buffered
	wait := runClaim(t, g, sess, claim)
	for i := range int64(3) {
		claim.msgs <- msg(10+i, 1+i, "a")
		time.Sleep(5 * time.Millisecond)
	}
	waitForEvent(t, sess, "mark 13") // full: does not wait the hour
	claim.msgs <- msg(13, 4, "a")
	close(claim.msgs) // the partition is released: the waiting batch goes
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{1, 2, 3}, {4}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v", r.h.batches, want)
	}

	cfg.BatchSize, cfg.BatchWait = 100, 30*time.Millisecond
	r = newRig(t, cfg)
	sess = &fakeSession{ctx: context.Background()}
	g = newBatchGroupHandler(t, cfg, r, &done, sess)
	claim = &fakeClaim{msgs: make(chan *sarama.ConsumerMessage)}
	wait = runClaim(t, g, sess, claim)
	start := time.Now()
	claim.msgs <- msg(10, 1, "a")
	claim.msgs <- msg(11, 2, "a")
	waitForEvent(t, sess, "mark 12") // BatchWait passed
	if el := time.Since(start); el < cfg.BatchWait {
		t.Errorf("batch done after %s, before BatchWait %s", el, cfg.BatchWait)
	}
	close(claim.msgs)
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if want := [][]int64{{1, 2}}; !slices.EqualFunc(r.h.batches, want, slices.Equal) {
		t.Fatalf("handler batches %v, want %v", r.h.batches, want)
	}
}

// New with BatchSize > 1 calls the Handler once per message of a batch, in
// order, each with its own trace context.
func TestPerMessageHandler(t *testing.T) {
	t.Parallel()
	var got []string
	h := HandlerFunc(func(ctx context.Context, _ pgx.Tx, m *Message) error {
		tc, _ := TraceContextFrom(ctx)
		got = append(got, fmt.Sprintf("%d:%s", m.OutboxID, tc.TraceParent))
		if m.OutboxID == 3 {
			return errFlaky
		}
		return nil
	})
	ms := []*Message{
		{OutboxID: 1, Headers: []Header{{Key: HeaderTraceParent, Value: []byte("tp1")}}},
		{OutboxID: 2},
		{OutboxID: 3, Headers: []Header{{Key: HeaderTraceParent, Value: []byte("tp3")}}},
		{OutboxID: 4},
	}
	ctx := context.WithValue(context.Background(), traceContextKey{}, TraceContext{TraceParent: "outer"})
	if err := (perMessage{h}).HandleBatch(ctx, nil, ms); !errors.Is(err, errFlaky) {
		t.Fatalf("err %v, want the third message's", err)
	}
	if want := []string{"1:tp1", "2:outer", "3:tp3"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q (stopping at the failure)", got, want)
	}
}

func TestBatchConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	if cfg.BatchSize != 1 || cfg.batchSize() != 1 {
		t.Fatalf("default BatchSize %d, want 1", cfg.BatchSize)
	}
	cfg.BatchSize = 0
	if cfg.batchSize() != 1 || cfg.Validate() != nil {
		t.Fatal("BatchSize 0 must mean 1")
	}
	cfg.BatchSize, cfg.BatchWait = -1, -time.Second
	err := cfg.Validate()
	for _, want := range []string{"batch size", "batch wait"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
	cfg.BatchSize, cfg.BatchWait = 1000, 0
	sc, err := cfg.saramaConfig()
	if err != nil || sc.ChannelBufferSize != 1000 {
		t.Fatalf("channel buffer %d (%v), want 1000 to hold a batch", sc.ChannelBufferSize, err)
	}
	if _, err := NewBatch(testConfig(), nil, BatchHandlerFunc(nil), zaptest.NewLogger(t)); err == nil {
		t.Fatal("NewBatch without a DB: no error")
	}
}
