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
