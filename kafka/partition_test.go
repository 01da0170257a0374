package kafka

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
	"weak"

	"go.uber.org/zap/zaptest"
)

// The partition state machine (partition.go), one transition at a time, on
// a producer with no run loop: the records that come back land on Results.

func bareProducer() *Producer {
	cfg := DefaultConfig()
	return &Producer{cfg: cfg, results: make(chan *Record, 16), closing: make(chan struct{}), now: time.Now}
}

func queued(p *Producer, ps *recBuf, ids ...int64) {
	for _, id := range ids {
		r := rec(id, "t", "a")
		r.enqueued = time.Now()
		ps.queue = append(ps.queue, r)
		ps.queued += r.Size() + recordOverhead
		p.outstanding++
	}
}

func partition() *recBuf {
	return &recBuf{topic: &topicState{name: "t"}}
}

func backIDs(p *Producer) (ids []int64, errs []error) {
	for {
		select {
		case r := <-p.results:
			ids, errs = append(ids, r.OutboxID), append(errs, r.Err)
		default:
			return ids, errs
		}
	}
}

func TestPartitionIdleWithoutRecordsHasNoWork(t *testing.T) {
	if ps := partition(); ps.phase != partIdle || ps.hasWork() {
		t.Fatalf("a new partition is %s with work %v, want idle without work", ps.phase, ps.hasWork())
	}
}

// idle ──send──▶ inFlight: a new batch from the queue.
func TestPartitionTakeFromIdleBuildsABatch(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1, 2)
	if !ps.hasWork() {
		t.Fatal("idle with queued records has no work")
	}
	b := ps.take(p)
	if ps.phase != partInFlight || ps.batch != b || len(b.recs) != 2 || len(ps.queue) != 0 {
		t.Fatalf("after take: %s, batch of %d, %d queued; want in flight with both records", ps.phase, len(b.recs), len(ps.queue))
	}
	if ps.hasWork() {
		t.Fatal("a partition in flight has work: a second batch would go out")
	}
}

// inFlight ──land──▶ idle, and ──wait──▶ waiting ──send──▶ inFlight with
// the same batch.
func TestPartitionLandWaitAndResendTheSameBatch(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	b := ps.take(p)
	got, cause := ps.land(time.Now())
	if got != b || cause != nil || ps.phase != partIdle || ps.batch != nil {
		t.Fatalf("land: batch %v cause %v, %s; want the batch back, idle", got == b, cause, ps.phase)
	}
	ps.wait(b)
	if ps.phase != partWaiting || !ps.hasWork() {
		t.Fatalf("wait: %s, work %v; want waiting with work", ps.phase, ps.hasWork())
	}
	queued(p, ps, 2)
	if again := ps.take(p); again != b || ps.phase != partInFlight || len(ps.queue) != 1 {
		t.Fatalf("take from waiting: same batch %v, %s, %d queued; want the same batch, the new record still queued", again == b, ps.phase, len(ps.queue))
	}
}

// land with nothing in flight gives nothing back (a stray response).
func TestPartitionLandWithoutABatch(t *testing.T) {
	for _, ph := range []partPhase{partIdle, partWaiting, partStopped} {
		ps := partition()
		ps.phase = ph
		if b, cause := ps.land(time.Now()); b != nil || cause != nil || ps.phase != ph {
			t.Errorf("land in %s: batch %v cause %v, now %s; want nothing, unchanged", ph, b, cause, ps.phase)
		}
	}
}

// idle ──stop──▶ stopped: the queue fails unsent, later records too.
func TestPartitionStopWhenIdle(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1, 2)
	cause := errors.New("boom")
	ps.stop(p, cause)
	ids, errs := backIDs(p)
	if ps.phase != partStopped || len(ids) != 2 || !errors.Is(errs[0], ErrProduce) || !errors.Is(errs[0], errPartitionStopped) {
		t.Fatalf("stopped idle: %s, back %v %v; want stopped, both records failed unsent", ps.phase, ids, errs)
	}
	if ps.failed != cause || ps.hasWork() {
		t.Fatalf("stopped: failed %v, work %v; want the cause kept, no work", ps.failed, ps.hasWork())
	}
}

// waiting ──stop──▶ stopped: the waiting batch fails with the cause.
func TestPartitionStopWhenWaiting(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	b := ps.take(p)
	ps.land(time.Now())
	ps.wait(b)
	queued(p, ps, 2)
	ps.stop(p, errors.New("boom"))
	ids, _ := backIDs(p)
	if ps.phase != partStopped || ps.batch != nil || len(ids) != 2 {
		t.Fatalf("stopped waiting: %s, batch %v, back %v; want stopped, batch and queue failed", ps.phase, ps.batch != nil, ids)
	}
}

// inFlight ──stop──▶ stopping ──land──▶ stopped: the batch is kept for its
// response, which decides its records (dropping it made the response
// dereference a missing batch: a panic).
func TestPartitionStopWhileInFlightKeepsTheBatch(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	b := ps.take(p)
	queued(p, ps, 2)
	cause := errors.New("topic deleted")
	ps.stop(p, cause)
	if ids, _ := backIDs(p); ps.phase != partStopping || ps.batch != b || len(ids) != 1 || ids[0] != 2 {
		t.Fatalf("stopped in flight: %s, batch kept %v, back %v; want stopping, the batch kept, the queued record failed", ps.phase, ps.batch == b, ids)
	}
	got, why := ps.land(time.Now())
	if got != b || why != cause || ps.phase != partStopped {
		t.Fatalf("land while stopping: batch %v cause %v, %s; want the batch with the stop's cause, stopped", got == b, why, ps.phase)
	}
	got.settle(p, why)
	if ids, errs := backIDs(p); len(ids) != 1 || ids[0] != 1 || !errors.Is(errs[0], cause) {
		t.Fatalf("settled: %v %v; want record 1 failed with the cause", ids, errs)
	}
}

// Rule: Close returns only once the run loop has returned (here it waits
// for a produce response held back), and Results is closed after every
// record came back. Fails if Close returns while the loop still runs.
func TestKafkaProducerCloseReturnsAfterTheRunLoop(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	p, err := NewProducer(testKafkaConfig(f.c.ListenAddrs()), zaptest.NewLogger(t), ProducerHooks{})
	if err != nil {
		t.Fatal(err)
	}
	held, release := holdResponses(p, "t", 0)
	sendAll(t, p, rec(1, "t", "a"))
	<-held
	stoppedAtReturn := make(chan bool, 1)
	go func() {
		p.Close()
		select {
		case <-p.stopped:
			stoppedAtReturn <- true
		default:
			stoppedAtReturn <- false
		}
	}()
	waitFor(t, p.closingNow)
	close(release)
	select {
	case ok := <-stoppedAtReturn:
		if !ok {
			t.Fatal("Close returned while the run loop still ran")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	n := 0
	for range p.Results() {
		n++
	}
	if n != 1 {
		t.Fatalf("%d records back, want 1", n)
	}
	if err := p.Send(context.Background(), rec(2, "t", "a")); !errors.Is(err, ErrProducerClosed) {
		t.Fatalf("Send after Close = %v", err)
	}
}

// Rule: Close does not wait for anyone to read Results: with Results full
// and nobody reading, it still returns, and every record comes back after
// it, exactly once, the acknowledged ones in the order they were sent.
// Fails (Close hangs) if the run loop blocks on Results after Close.
func TestKafkaProducerCloseDoesNotWaitForAReader(t *testing.T) {
	f := startFakeKafka(t, 1, "t")
	p := newTestProducer(t, testKafkaConfig(f.c.ListenAddrs()))
	n := cap(p.results) + 100
	for i := 1; i <= n; i++ {
		sendAll(t, p, rec(int64(i), "t", "a"))
	}
	waitFor(t, func() bool { return len(p.Results()) == cap(p.results) })
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a reader of Results")
	}
	seen := map[int64]bool{}
	lastAcked := int64(0)
	for r := range p.Results() {
		if seen[r.OutboxID] {
			t.Fatalf("record %d back twice", r.OutboxID)
		}
		seen[r.OutboxID] = true
		if r.Err == nil {
			if r.OutboxID < lastAcked {
				t.Fatalf("acknowledged record %d back after %d", r.OutboxID, lastAcked)
			}
			lastAcked = r.OutboxID
		}
	}
	if len(seen) != n {
		t.Fatalf("%d records back, want %d", len(seen), n)
	}
}

// inFlight with records queued behind its batch: still no work. The records
// wait for the batch's answer: one batch per partition in flight (rule 1).
func TestPartitionInFlightWithQueuedRecordsHasNoWork(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	ps.take(p)
	queued(p, ps, 2, 3)
	if ps.hasWork() {
		t.Fatal("a partition in flight with queued records has work: a second batch would go out before the first's answer")
	}
}

// An Urgent record makes its partition due at once, linger or not, and
// only until the batch that takes it: the read barrier a session waits on
// alone went out only after a 3 s --kafka-linger, long enough for
// wal_sender_timeout to end the replication connection (a fresh-clone CI
// run restarted TestRunKeepsStatusUpdatesFlowingWhileBackpressured every
// 6 s).
func TestPartitionUrgentRecordIsDueWithoutTheLinger(t *testing.T) {
	p, ps := bareProducer(), partition()
	now := time.Now()
	const linger = time.Hour
	ps.push(rec(1, "t", "a"), now)
	if ok, at := ps.due(now, linger, 1<<20); ok || !at.Equal(now.Add(linger)) {
		t.Fatalf("a queued record: due %v at %v, want due after the linger", ok, at)
	}
	r := rec(2, "t", "a")
	r.Urgent = true
	ps.push(r, now)
	if ok, _ := ps.due(now, linger, 1<<20); !ok {
		t.Fatal("a queue holding an urgent record waits for the linger")
	}
	b := ps.take(p)
	if len(b.recs) != 2 {
		t.Fatalf("the batch took %d records, want both", len(b.recs))
	}
	ps.land(time.Now())
	ps.push(rec(3, "t", "a"), now)
	if ok, _ := ps.due(now, linger, 1<<20); ok {
		t.Fatal("the partition stayed urgent after the batch took its urgent record")
	}
}

// inFlight ──expire──▶ abandoned ──land──▶ stopped: at its delivery
// timeout a batch still in flight fails at once, the records behind it fail
// unsent, and its answer, whenever it comes, decides nothing.
func TestPartitionExpireInFlightAbandonsTheBatch(t *testing.T) {
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	b := ps.take(p)
	queued(p, ps, 2)
	cause := errors.New("no answer")
	if !ps.expire(p, cause) {
		t.Fatal("expire in flight does not report the request to abort")
	}
	ids, errs := backIDs(p)
	if ps.phase != partAbandoned || ps.batch != b || len(ids) != 2 || ids[0] != 1 || !errors.Is(errs[0], cause) || !errors.Is(errs[1], errPartitionStopped) {
		t.Fatalf("expired in flight: %s, back %v %v; want abandoned, record 1 failed with the cause, then record 2 unsent", ps.phase, ids, errs)
	}
	if ps.hasWork() || ps.drained() {
		t.Fatalf("abandoned: work %v, drained %v; want no work, not drained (its request is still out)", ps.hasWork(), ps.drained())
	}
	got, why := ps.land(time.Now())
	if got != nil || why != cause || ps.phase != partStopped {
		t.Fatalf("land when abandoned: batch %v cause %v, %s; want no batch to decide, the cause, stopped", got != nil, why, ps.phase)
	}
	if ids, _ := backIDs(p); len(ids) != 0 {
		t.Fatalf("records %v came back twice", ids)
	}
}

// waiting, idle ──expire──▶ stopped: the oldest record fails with the
// cause, those behind it unsent.
func TestPartitionExpireWaitingOrQueued(t *testing.T) {
	cause := errors.New("no leader")
	p, ps := bareProducer(), partition()
	queued(p, ps, 1)
	b := ps.take(p)
	ps.land(time.Now())
	ps.wait(b)
	queued(p, ps, 2)
	if ps.expire(p, cause) {
		t.Fatal("expire while waiting reports a request in flight")
	}
	ids, errs := backIDs(p)
	if ps.phase != partStopped || ps.batch != nil || len(ids) != 2 || !errors.Is(errs[0], cause) || !errors.Is(errs[1], errPartitionStopped) {
		t.Fatalf("expired waiting: %s, back %v %v; want stopped, the batch failed with the cause, the queue unsent", ps.phase, ids, errs)
	}
	p, ps = bareProducer(), partition()
	queued(p, ps, 3, 4)
	ps.expire(p, cause)
	ids, errs = backIDs(p)
	if ps.phase != partStopped || len(ids) != 2 || ids[0] != 3 || !errors.Is(errs[0], cause) || !errors.Is(errs[1], errPartitionStopped) || ps.queued != 0 {
		t.Fatalf("expired idle: %s, back %v %v, %d bytes queued; want stopped, the head failed with the cause, the rest unsent", ps.phase, ids, errs, ps.queued)
	}
}

// The delivery timeout runs from a batch's first send, and for a queued
// record from when it could first have been sent: queued, and its
// partition's previous batch back.
func TestPartitionDeadlineRunsFromTheFirstAttempt(t *testing.T) {
	const timeout = time.Minute
	p, ps := bareProducer(), partition()
	if d := ps.deadline(timeout); !d.IsZero() {
		t.Fatalf("empty partition has deadline %v", d)
	}
	queued(p, ps, 1)
	enq := ps.queue[0].enqueued
	if d := ps.deadline(timeout); !d.Equal(enq.Add(timeout)) {
		t.Fatalf("queued: deadline %v, want its enqueue time + timeout", d)
	}
	b := ps.take(p)
	queued(p, ps, 2)
	if d := ps.deadline(timeout); !d.Equal(b.sent.Add(timeout)) {
		t.Fatalf("in flight: deadline %v, want its first send + timeout", d)
	}
	landed := time.Now().Add(time.Second)
	ps.land(landed)
	if d := ps.deadline(timeout); !d.Equal(landed.Add(timeout)) {
		t.Fatalf("queued behind a batch that came back later: deadline %v, want the landing + timeout", d)
	}
}

// A record taken into a batch is held by the batch only: once the batch is
// acknowledged and dropped, the queue that keeps receiving records behind
// it must not keep it (and its value) alive. The queue's array outlives
// the batch, and its slots pointing at taken records held a drain's
// acknowledged records beyond the byte budget, whose room had been
// released.
func TestPartitionTakenRecordsAreNotKeptByTheQueue(t *testing.T) {
	p, ps := bareProducer(), partition()
	p.cfg.MaxMessageBytes = 64 // one small record per batch
	queued(p, ps, 1, 2, 3)
	taken := weak.Make(ps.queue[0])
	b := ps.take(p)
	if len(b.recs) != 1 || b.recs[0].OutboxID != 1 {
		t.Fatalf("took %d records, want record 1 alone", len(b.recs))
	}
	ps.land(time.Now())
	b.ack(p, 0)
	backIDs(p)
	b = nil
	runtime.GC()
	if taken.Value() != nil {
		t.Fatal("record 1 is still reachable after its batch was acknowledged and dropped: the queue's array keeps it")
	}
	if len(ps.queue) != 2 {
		t.Fatalf("%d queued, want records 2 and 3", len(ps.queue))
	}
}
