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
	"go.uber.org/zap/zaptest"
)

func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Brokers = []string{"127.0.0.1:1"}
	cfg.GroupID = "g"
	cfg.Topics = []string{"t"}
	return cfg
}

type rig struct {
	store *fakeStore
	prod  *fakeProducer
	h     *scriptHandler
	sleep *recordingSleep
	proc  *processor
}

func newRig(t *testing.T, cfg Config) *rig {
	r := &rig{store: newFakeStore(), prod: &fakeProducer{}, h: newScriptHandler(), sleep: &recordingSleep{}}
	r.proc = &processor{cfg: cfg, store: r.store, dlq: r.prod, h: r.h, log: zaptest.NewLogger(t), stats: &counters{}, sleep: r.sleep.sleep}
	return r
}

func (r *rig) process(t *testing.T, cm *sarama.ConsumerMessage) (Result, error) {
	t.Helper()
	m, perr := newMessage(cm)
	return r.proc.process(context.Background(), m, perr)
}

func header(pm *sarama.ProducerMessage, key string) string {
	for _, h := range pm.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return "<none>"
}

func TestProcessOutcomes(t *testing.T) {
	t.Parallel()
	base := 100 * time.Millisecond
	for _, tc := range []struct {
		name      string
		setup     func(h *scriptHandler)
		id        int64
		outcome   Outcome
		attempts  int
		class     string
		waits     []time.Duration
		errSubstr string
	}{
		{name: "ok", id: 1, outcome: Processed, attempts: 1},
		{name: "domain error goes to the DLQ at once", id: 2, outcome: DeadLettered, attempts: 1, class: ClassDomain,
			setup: func(h *scriptHandler) { h.always[2] = Domain(errors.New("invalid transition")) }, errSubstr: "invalid transition"},
		{name: "wrapped domain error", id: 3, outcome: DeadLettered, attempts: 1, class: ClassDomain,
			setup: func(h *scriptHandler) { h.always[3] = fmt.Errorf("apply: %w", Domainf("bad %s", "payload")) }, errSubstr: "apply: bad payload"},
		{name: "transient twice then ok", id: 4, outcome: Processed, attempts: 3, waits: []time.Duration{base, 2 * base},
			setup: func(h *scriptHandler) { h.script[4] = []error{errFlaky, errFlaky} }},
		{name: "transient exhausted", id: 5, outcome: DeadLettered, attempts: 6, class: ClassTransient,
			waits: []time.Duration{base, 2 * base, 4 * base, 8 * base, 16 * base},
			setup: func(h *scriptHandler) { h.always[5] = errFlaky }, errSubstr: "flaky"},
		{name: "panic is a domain error", id: 6, outcome: DeadLettered, attempts: 1, class: ClassDomain,
			setup: func(h *scriptHandler) { h.panics[6] = true }, errSubstr: "handler panicked: boom"},
		{name: "no outbox id", id: 0, outcome: DeadLettered, attempts: 1, class: ClassDomain, errSubstr: "no valid outbox-id header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, testConfig())
			if tc.setup != nil {
				tc.setup(r.h)
			}
			res, err := r.process(t, msg(7, tc.id, "order-1"))
			if err != nil {
				t.Fatalf("process: %v", err)
			}
			if res.Outcome != tc.outcome || res.Attempts != tc.attempts || res.Class != tc.class {
				t.Fatalf("result %+v, want outcome %v attempts %d class %q", res, tc.outcome, tc.attempts, tc.class)
			}
			if !slices.Equal(r.sleep.waits, tc.waits) {
				t.Errorf("waits %v, want %v", r.sleep.waits, tc.waits)
			}
			if tc.outcome != DeadLettered {
				if len(r.prod.sent) != 0 {
					t.Fatalf("%d dead-letter records, want none", len(r.prod.sent))
				}
				return
			}
			if len(r.prod.sent) != 1 {
				t.Fatalf("%d dead-letter records, want 1", len(r.prod.sent))
			}
			d := r.prod.sent[0]
			if d.Topic != "t.dlq" || res.DeadLetterTopic != "t.dlq" {
				t.Errorf("dead-letter topic %q (result %q), want t.dlq", d.Topic, res.DeadLetterTopic)
			}
			if got := header(d, HeaderError); !strings.Contains(got, tc.errSubstr) {
				t.Errorf("error header %q, want it to contain %q", got, tc.errSubstr)
			}
			if got := header(d, HeaderErrorClass); got != tc.class {
				t.Errorf("class header %q, want %q", got, tc.class)
			}
			if got := header(d, HeaderAttempts); got != fmt.Sprint(tc.attempts) {
				t.Errorf("attempts header %q, want %d", got, tc.attempts)
			}
			if r.store.committed[tc.id] {
				t.Errorf("a dead-lettered id was recorded as processed")
			}
		})
	}
}

func TestProcessDuplicateSkipsHandler(t *testing.T) {
	t.Parallel()
	r := newRig(t, testConfig())
	for i, want := range []Outcome{Processed, Duplicate, Duplicate} {
		res, err := r.process(t, msg(int64(i), 9, "k"))
		if err != nil || res.Outcome != want {
			t.Fatalf("delivery %d: %+v, %v; want %v", i, res, err, want)
		}
	}
	if r.h.calls[9] != 1 || r.store.dups[9] != 2 {
		t.Fatalf("handler calls %d, duplicates %d; want 1, 2", r.h.calls[9], r.store.dups[9])
	}
}

// The consumer's own database failures are retried without limit and do not
// count as attempts: they never dead-letter a message.
func TestProcessDBErrorsNeverDeadLetter(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxRetries = 1
	r := newRig(t, cfg)
	for range 10 {
		r.store.dbErrs = append(r.store.dbErrs, errors.New("connection refused"))
	}
	res, err := r.process(t, msg(0, 1, "k"))
	if err != nil || res.Outcome != Processed || res.Attempts != 1 {
		t.Fatalf("got %+v, %v; want processed at attempt 1", res, err)
	}
	if len(r.prod.sent) != 0 {
		t.Fatal("dead-lettered on database errors")
	}
	if len(r.sleep.waits) != 10 || r.sleep.waits[9] != cfg.BackoffMax {
		t.Fatalf("waits %v, want 10 growing to %s", r.sleep.waits, cfg.BackoffMax)
	}
}

// Exhausted transient retries with the database unreachable start over
// instead of dead-lettering.
func TestProcessExhaustedWhileDatabaseDown(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.MaxRetries = 2
	r := newRig(t, cfg)
	r.h.script[1] = []error{errFlaky, errFlaky, errFlaky, errFlaky} // 3 fail, ping fails, 1 more fails, then ok
	r.store.pingErrs = []error{errors.New("connection refused")}
	res, err := r.process(t, msg(0, 1, "k"))
	if err != nil || res.Outcome != Processed {
		t.Fatalf("got %+v, %v; want processed", res, err)
	}
	if res.Attempts != 2 || r.h.calls[1] != 5 || r.store.pings != 1 {
		t.Fatalf("attempts %d, calls %d, pings %d; want 2 (counted again after the outage), 5, 1", res.Attempts, r.h.calls[1], r.store.pings)
	}
}

func TestProcessDeadLetterFailureIsNotDone(t *testing.T) {
	t.Parallel()
	r := newRig(t, testConfig())
	r.prod.err = sarama.ErrUnknownTopicOrPartition
	r.h.always[1] = Domain(errors.New("nope"))
	_, err := r.process(t, msg(3, 1, "k"))
	var dle *DeadLetterError
	if !errors.As(err, &dle) || !errors.Is(err, ErrDeadLetter) || !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		t.Fatalf("err = %v, want a *DeadLetterError for the unknown topic", err)
	}
	if dle.Offset != 3 || dle.DeadLetterTopic != "t.dlq" || !IsDomain(dle.Cause) {
		t.Fatalf("error fields %+v", dle)
	}
}

func TestProcessStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	r := newRig(t, testConfig())
	r.h.always[1] = errFlaky
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m, _ := newMessage(msg(0, 1, "k"))
	if _, err := r.proc.process(ctx, m, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(r.prod.sent) != 0 {
		t.Fatal("dead-lettered while stopping")
	}
}

func TestDeadLetterRecord(t *testing.T) {
	t.Parallel()
	m := &Message{
		Topic: "orders", Partition: 2, Offset: 41, Key: nil, Value: []byte("v"),
		Headers: []Header{{Key: "outbox-id", Value: []byte("7")}, {Key: HeaderError, Value: []byte("old")}, {Key: "x", Value: nil}},
	}
	long := strings.Repeat("e", 5000)
	d := deadLetterRecord("orders.dlq", "grp", m, errors.New(long), ClassTransient, 6)
	if d.Key != nil {
		t.Errorf("key %v, want nil (kept as it was)", d.Key)
	}
	var keys []string
	for _, h := range d.Headers {
		keys = append(keys, string(h.Key))
	}
	want := []string{"outbox-id", "x", HeaderError, HeaderErrorClass, HeaderSourceTopic, HeaderSourcePartition,
		HeaderSourceOffset, HeaderAttempts, HeaderConsumerGroup}
	if !slices.Equal(keys, want) {
		t.Fatalf("headers %q, want %q", keys, want)
	}
	for k, v := range map[string]string{HeaderSourceTopic: "orders", HeaderSourcePartition: "2", HeaderSourceOffset: "41",
		HeaderAttempts: "6", HeaderConsumerGroup: "grp", HeaderErrorClass: "transient"} {
		if got := header(d, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if got := header(d, HeaderError); len(got) != maxErrorHeader || !strings.HasSuffix(got, "...") {
		t.Errorf("error header of %d bytes, want it cut to %d", len(got), maxErrorHeader)
	}
}

func TestNewMessageOutboxID(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int64{"42": 42, " 7 ": 7, "": 0, "abc": 0, "0": 0, "-3": 0, "99999999999999999999": 0} {
		cm := &sarama.ConsumerMessage{Headers: []*sarama.RecordHeader{{Key: []byte(HeaderOutboxID), Value: []byte(v)}}}
		m, err := newMessage(cm)
		if want == 0 {
			if !errors.Is(err, ErrNoOutboxID) || !IsDomain(err) {
				t.Errorf("%q: err %v, want a domain ErrNoOutboxID", v, err)
			}
			continue
		}
		if err != nil || m.OutboxID != want {
			t.Errorf("%q: id %d, err %v; want %d", v, m.OutboxID, err, want)
		}
	}
	if _, err := newMessage(&sarama.ConsumerMessage{}); !errors.Is(err, ErrNoOutboxID) {
		t.Errorf("no header: err %v, want ErrNoOutboxID", err)
	}
}

// TestNewMessageDuplicateHeaderRefused: a record carrying outbox-id or
// outbox-origin twice (a writer's copy beside outboxd's, from an outboxd
// before it refused such events) is a domain error, whichever copy comes
// first: deduplicating on either could skip an event as another's
// duplicate.
func TestNewMessageDuplicateHeaderRefused(t *testing.T) {
	t.Parallel()
	h := func(k, v string) *sarama.RecordHeader { return &sarama.RecordHeader{Key: []byte(k), Value: []byte(v)} }
	for name, hs := range map[string][]*sarama.RecordHeader{
		"origin, writer's first": {h(HeaderOutboxID, "7"), h(HeaderOrigin, "forged/1/1"), h(HeaderOrigin, "sys/db/1")},
		"origin, writer's last":  {h(HeaderOutboxID, "7"), h(HeaderOrigin, "sys/db/1"), h(HeaderOrigin, "forged/1/1")},
		"outbox-id twice":        {h(HeaderOutboxID, "7"), h("aggregate-id", "k"), h(HeaderOutboxID, "8")},
	} {
		m, err := newMessage(&sarama.ConsumerMessage{Headers: hs})
		if !errors.Is(err, ErrDuplicateHeader) || !IsDomain(err) {
			t.Errorf("%s: message %+v, err %v; want a domain ErrDuplicateHeader", name, m, err)
		}
	}
	m, err := newMessage(&sarama.ConsumerMessage{Headers: []*sarama.RecordHeader{h(HeaderOutboxID, "7"), h("traceparent", "a"), h("traceparent", "b"), h(HeaderOrigin, "sys/db/1")}})
	if err != nil || m.OutboxID != 7 || m.Origin != "sys/db/1" {
		t.Errorf("each once (a writer's own header twice): id %d origin %q err %v, want 7 sys/db/1", m.OutboxID, m.Origin, err)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	cfg := testConfig()
	cfg.BackoffBase, cfg.BackoffMax = 100*time.Millisecond, time.Second
	var got []time.Duration
	for n := 1; n <= 6; n++ {
		got = append(got, cfg.backoff(n))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("backoff %v, want %v", got, want)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if err := testConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	bad := DefaultConfig()
	bad.MaxRetries = -1
	bad.BackoffBase = 0
	bad.CommitInterval = -1
	bad.DedupTable = "a.b.c"
	bad.Topics = []string{"x"}
	bad.DeadLetterTopic = func(t string) string { return t }
	err := bad.Validate()
	for _, want := range []string{"no Kafka brokers", "no consumer group id", "max retries", "backoff base", "commit interval", "dedup table", `dead-letter topic "x"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}
