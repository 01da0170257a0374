package publisher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap/zaptest"

	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/replication"
)

// Checkpoint epochs: a session paused past wal_sender_timeout (SIGSTOP, a
// long GC, a frozen VM) while another takes the slot over can write its last
// checkpoint after the new owner's newer ones. Compaction and a reader that
// took the last record per key made that stale one the checkpoint, and the
// next start halted on a false gap. Each session now writes under a key of
// its own epoch, and the reader takes the highest epoch.

// startKfakeCheckpoints is an in-process Kafka with the orders topic and a
// one-partition checkpoint topic "cp", as EnsureCompactedTopic makes it
// (epochs are offsets in that one partition).
func startKfakeCheckpoints(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"), kfake.SeedTopics(1, "cp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// freezableProducer holds the first checkpoint record sent after freeze
// until thaw: the instance is paused with that write in hand, as a process
// stopped between deciding to write a checkpoint and sending it.
type freezableProducer struct {
	outbox.Producer
	armed  atomic.Bool
	held   chan struct{} // closed once a record is held
	thawed chan struct{}
	once   sync.Once
}

func (p *freezableProducer) Send(ctx context.Context, r *kafka.Record) error {
	if r.Topic == "cp" && r.Value != nil && p.armed.Load() {
		p.once.Do(func() { close(p.held) })
		select {
		case <-p.thawed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.Producer.Send(ctx, r)
}

// checkpointReads records what each session read (ReadCheckpoint through
// the real reader against brokers).
type checkpointReads struct {
	mu    sync.Mutex
	reads []*Checkpoint
}

func (c *checkpointReads) read(brokers []string) func(context.Context, Identity, []kafka.Barrier) (*Checkpoint, error) {
	return func(ctx context.Context, id Identity, barrier []kafka.Barrier) (*Checkpoint, error) {
		cp, err := readCheckpoint(ctx, e2eKafkaConfig(brokers), "cp", id, barrier...)
		c.mu.Lock()
		c.reads = append(c.reads, cp)
		c.mu.Unlock()
		return cp, err
	}
}

func (c *checkpointReads) all() []*Checkpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Checkpoint(nil), c.reads...)
}

// Rule: the checkpoint a paused earlier owner writes after the new owner's
// newer ones does not count. A streams and checkpoints 2000; it is paused
// holding the checkpoint of 3000 (its stream ends there: the server dropped
// its walsender); B takes the slot over at 2000 and checkpoints 5000;
// B stops; A wakes and its checkpoint of 3000 lands last. The next start
// must resume from 5000, not halt on a gap between 3000 and the slot at
// 5000 (what it did while every session wrote under one key).
func TestServiceCheckpointOfAPausedOwnerWrittenLateIsIgnored(t *testing.T) {
	brokers := startKfakeCheckpoints(t)
	srv := newFakeServer(0)
	commitOrders(srv, 2)
	// A's stream ends once it has delivered the WAL it found after
	// endA is set (the fake source asks runErr only then).
	var endA atomic.Bool
	aEnded := make(chan struct{})
	var aEndOnce sync.Once
	srv.runErr = func(session int) error {
		if session == 0 && endA.Load() {
			aEndOnce.Do(func() { close(aEnded) })
			return errors.New("fake walsender ended: wal_sender_timeout while the instance was paused")
		}
		return nil
	}
	reads := &checkpointReads{}
	cfg := svcConfig()
	cfg.CheckpointTopic = "cp"
	newProducer := func(Identity) (outbox.Producer, error) {
		return kafka.NewProducer(e2eKafkaConfig(brokers), zaptest.NewLogger(t), kafka.ProducerHooks{})
	}

	// A: the first owner.
	frozen := &freezableProducer{held: make(chan struct{}), thawed: make(chan struct{})}
	a := newSvcHarness(t, srv, nil)
	aOpens := 0
	a.deps.OpenSource = func(ctx context.Context) (Source, error) {
		if aOpens++; aOpens > 1 {
			// After its session ends, A finds the slot held: a standby.
			return nil, &replication.SlotInUseError{Slot: "outboxd", PID: 101}
		}
		return srv.open(ctx)
	}
	a.deps.NewProducer = func(id Identity) (outbox.Producer, error) {
		p, err := newProducer(id)
		frozen.Producer = p
		return frozen, err
	}
	a.deps.ReadCheckpoint, a.deps.ReadSlotHolder = reads.read(brokers), srv.holder
	a.start(cfg)
	a.waitSlotConfirmed(2000)

	// A is paused with the checkpoint of 3000 in hand; its walsender ends.
	frozen.armed.Store(true)
	srv.commit(3000, event(5, "a", "orders"), event(6, "b", "orders"))
	endA.Store(true)
	for _, ch := range []chan struct{}{frozen.held, aEnded} {
		select {
		case <-ch:
		case <-time.After(waitTimeout):
			t.Fatal("A never held its checkpoint of 3000 with its stream ended")
		}
	}
	if got := srv.slotConfirmed(); got != 2000 {
		t.Fatalf("the slot confirmed %s while A's checkpoint of 3000 is held, want 2000", got)
	}

	// B takes the slot over from 2000 and publishes up to 5000.
	b := newSvcHarness(t, srv, nil)
	b.deps.NewProducer, b.deps.ReadCheckpoint, b.deps.ReadSlotHolder = newProducer, reads.read(brokers), srv.holder
	b.start(cfg)
	srv.commit(4000, event(7, "a", "orders"), event(8, "b", "orders"))
	srv.commit(5000, event(9, "a", "orders"), event(10, "b", "orders"))
	b.waitSlotConfirmed(5000)
	if err := b.stop(); err != nil {
		t.Fatalf("B: Run = %v", err)
	}

	// A wakes: its checkpoint of 3000 is written after B's, and A, its
	// session over, finds the slot held and waits as a standby.
	close(frozen.thawed)
	waitUntil(t, "A a standby after its last checkpoint was written", func() bool { return a.svc.State() == outbox.StateStandby })
	latest, err := kafka.ReadCompactedRecords(context.Background(), e2eKafkaConfig(brokers), "cp")
	if err != nil {
		t.Fatal(err)
	}
	var lastKey string
	var lastOffset int64 = -1
	for k, r := range latest {
		if _, _, ok := SplitCheckpointKey(k); ok && r.Offset > lastOffset {
			lastKey, lastOffset = k, r.Offset
		}
	}
	if cp, err := ParseCheckpoint(latest[lastKey].Value); err != nil || cp.EndLSN != 3000 {
		t.Fatalf("the last checkpoint record written is %q: %+v, %v; want A's stale 3000 (the case under test)", lastKey, cp, err)
	}

	// C starts: it resumes from B's 5000.
	c := newSvcHarness(t, srv, nil)
	c.deps.NewProducer, c.deps.ReadCheckpoint, c.deps.ReadSlotHolder = newProducer, reads.read(brokers), srv.holder
	c.start(cfg)
	srv.commit(6000, event(11, "a", "orders"), event(12, "b", "orders"))
	waitUntil(t, "C confirmed 6000 (or halted)", func() bool {
		select {
		case err := <-c.errc:
			t.Fatalf("C halted: %v", err)
		default:
		}
		return srv.slotConfirmed() == 6000
	})
	rs := reads.all()
	if len(rs) != 3 || rs[2] == nil || rs[2].EndLSN != 5000 {
		t.Fatalf("the checkpoints read by A, B, C: %s; want C to read B's 5000", describe(rs))
	}
	if rs[1] == nil || rs[2].Epoch <= rs[1].Epoch || rs[1].Epoch <= 0 {
		t.Fatalf("epochs read: %s; want B's epoch above A's", describe(rs))
	}
	if starts := srv.startLSNs(); starts[len(starts)-1] != 5000 {
		t.Fatalf("sessions started at %v, want C's at 5000", starts)
	}
	if err := c.stop(); err != nil {
		t.Fatalf("C: Run = %v", err)
	}
	// C tombstoned the earlier epochs' keys once its own held a record: the
	// topic keeps one checkpoint for the identity.
	latest, err = kafka.ReadCompactedRecords(context.Background(), e2eKafkaConfig(brokers), "cp")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range latest {
		if _, _, ok := SplitCheckpointKey(k); ok {
			keys = append(keys, k)
		}
	}
	if len(keys) != 1 {
		t.Fatalf("checkpoint keys left: %v; want only C's epoch", keys)
	}
	if _, e, _ := SplitCheckpointKey(keys[0]); e <= rs[2].Epoch {
		t.Fatalf("checkpoint key left: %s; want C's epoch, above B's %d", keys[0], rs[2].Epoch)
	}
}

func describe(cps []*Checkpoint) string {
	var b strings.Builder
	for i, cp := range cps {
		if i > 0 {
			b.WriteString(", ")
		}
		if cp == nil {
			b.WriteString("none")
			continue
		}
		fmt.Fprintf(&b, "%s in epoch %d", cp.EndLSN, cp.Epoch)
	}
	return b.String()
}

// Rule: a session whose slot was taken over before its read barrier was
// acknowledged (paused between START_REPLICATION and the barrier, its
// walsender ended meanwhile) has no epoch: its barrier landed after the new
// owner's, so checkpoints under it would outrank the new owner's. It reads
// and writes no checkpoint and restarts.
func TestServiceSessionWhoseSlotWasTakenOverWritesNoCheckpoint(t *testing.T) {
	brokers := startKfakeCheckpoints(t)
	srv := newFakeServer(0)
	commitOrders(srv, 2)
	reads := &checkpointReads{}
	h := newSvcHarness(t, srv, nil)
	h.deps.NewProducer = func(Identity) (outbox.Producer, error) {
		return kafka.NewProducer(e2eKafkaConfig(brokers), zaptest.NewLogger(t), kafka.ProducerHooks{})
	}
	var asked atomic.Int32
	h.deps.ReadCheckpoint = reads.read(brokers)
	h.deps.ReadSlotHolder = func(ctx context.Context) (int, error) {
		if asked.Add(1) == 1 {
			return 4242, nil // the first session's slot: another process's by now
		}
		return srv.holder(ctx)
	}
	cfg := svcConfig()
	cfg.CheckpointTopic = "cp"
	h.start(cfg)
	h.waitSlotConfirmed(2000)
	if err := h.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if got := h.restarts("postgres"); got != 1 {
		t.Fatalf("%v restarts by cause postgres, want 1 (the session that lost its slot)", got)
	}
	if !logged(h, "another took the slot over") {
		t.Errorf("the restart's log does not say the slot was taken over")
	}
	if n := len(reads.all()); n != 1 {
		t.Fatalf("%d checkpoint reads, want 1: only the session that kept its slot reads", n)
	}
	if starts := srv.startLSNs(); len(starts) != 2 {
		t.Fatalf("sessions started at %v, want 2", starts)
	}
}

// logged reports whether any log entry's message or error mentions s.
func logged(h *svcHarness, s string) bool {
	for _, e := range h.logs.All() {
		if strings.Contains(e.Message, s) {
			return true
		}
		for _, f := range e.Context {
			if strings.Contains(f.String, s) {
				return true
			}
			if err, ok := f.Interface.(error); ok && strings.Contains(err.Error(), s) {
				return true
			}
		}
	}
	return false
}

// Rule: the reader takes the latest record of the highest epoch of its own
// identity, whatever was written last; the key from before epochs counts as
// the newest only when it was written after every epoch's record.
func TestPickCheckpoint(t *testing.T) {
	base := testID.Key()
	rec := func(off int64, end pglogrepl.LSN) kafka.CompactedRecord {
		v, err := Checkpoint{EndLSN: end}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		return kafka.CompactedRecord{Offset: off, Value: v}
	}
	other := Identity{SystemID: testID.SystemID, Database: testID.Database + "/s", Slot: "x"}.Key() // a database named "db/s"
	hashDB := Identity{SystemID: testID.SystemID, Database: "a#1/b", Slot: "s"}.Key()
	for _, tc := range []struct {
		name      string
		latest    map[string]kafka.CompactedRecord
		want      pglogrepl.LSN
		wantEpoch int64
	}{
		{"none", map[string]kafka.CompactedRecord{base + "/read-barrier": {Offset: 1}}, 0, 0},
		{"before epochs", map[string]kafka.CompactedRecord{base: rec(3, 100)}, 100, 0},
		{"a lower epoch written last", map[string]kafka.CompactedRecord{base + "#7": rec(9, 300), base + "#20": rec(21, 500), base + "#3": rec(30, 200)}, 500, 20},
		{"the key before epochs written before the epochs", map[string]kafka.CompactedRecord{base: rec(30, 100), base + "#31": rec(32, 500)}, 500, 31},
		{"the key before epochs written after them (an older outboxd ran since)", map[string]kafka.CompactedRecord{base + "#31": rec(32, 500), base: rec(40, 700)}, 700, 0},
		{"other identities' keys", map[string]kafka.CompactedRecord{base + "#5": rec(6, 500), other + "#90": rec(91, 900), base + "x#99": rec(99, 1), base + "#099": rec(100, 1)}, 500, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, err := PickCheckpoint(tc.latest, base)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == 0 {
				if cp != nil {
					t.Fatalf("PickCheckpoint = %s, want none", describe([]*Checkpoint{cp}))
				}
				return
			}
			if cp == nil || cp.EndLSN != tc.want || cp.Epoch != tc.wantEpoch {
				t.Fatalf("PickCheckpoint = %s, want %s in epoch %d", describe([]*Checkpoint{cp}), tc.want, tc.wantEpoch)
			}
		})
	}
	// A database name may hold a "#": its keys are still its own.
	cp, err := PickCheckpoint(map[string]kafka.CompactedRecord{hashDB: rec(3, 100), hashDB + "#2": rec(4, 200), base + "#9": rec(9, 900)}, hashDB)
	if err != nil || cp == nil || cp.EndLSN != 200 || cp.Epoch != 2 {
		t.Fatalf("PickCheckpoint for database %q = %s, %v; want 200 in epoch 2", "a#1/b", describe([]*Checkpoint{cp}), err)
	}
	if c, _ := PickCheckpoint(map[string]kafka.CompactedRecord{hashDB: rec(3, 100)}, hashDB); c == nil || c.EndLSN != 100 {
		t.Fatalf("PickCheckpoint for database %q before epochs = %s, want 100", "a#1/b", describe([]*Checkpoint{c}))
	}
}
