package exactlyonce

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/publisher"
)

// A paused at-least-once owner: outboxd A is frozen (SIGSTOP) under load
// and the server drops its walsender (as wal_sender_timeout would); the
// standby B takes the slot over and publishes everything. B is frozen in
// turn, so that nothing it writes can follow what A writes on waking; A
// wakes, writes its last checkpoint — older than B's — after B's, and waits
// as a standby. B is killed; A takes over and must read B's checkpoint, not
// its own late one: before checkpoint epochs it halted on a false gap
// between the checkpoint and the slot.
func TestRunAtLeastOnceZombieCheckpointIsIgnored(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	cp := testenv.UniqueName("checkpoints")
	args := []string{"--checkpoint-topic", cp}
	a := e.Start(args...)
	b := e2e.StartDaemon(t, e.Args(args...)...)
	b.WaitLog("standby", 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 300)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 300 })
	_ = syscall.Kill(a.PID(), syscall.SIGSTOP)
	e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot)
	b.WaitLog("taking over", 60*time.Second)
	e2e.WaitFor(t, time.Minute, func() bool { return strings.Count(b.Out.String(), "streaming") >= 1 })
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 1500 })
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	e.WaitConfirmed(time.Minute) // B checkpointed everything written
	_ = syscall.Kill(b.PID(), syscall.SIGSTOP)
	_ = syscall.Kill(a.PID(), syscall.SIGCONT)
	// A's session ends on its dropped connection (writing its last
	// checkpoint first) and it finds the slot held by B: a standby.
	e2e.WaitFor(t, time.Minute, func() bool {
		out := a.Out.String()
		return a.Exited() || strings.LastIndex(out, "standby: another process holds the slot") > strings.LastIndex(out, "streaming")
	})
	if a.Exited() {
		t.Fatalf("A exited %d on waking:\n%s", a.Code, a.Out.String())
	}
	last, lastKey, newest := checkpointLog(t, e.Brokers, cp)
	t.Logf("checkpoint topic: the last record written is at %s (%s), the newest position written %s", last.EndLSN, lastKey, newest)
	if last.EndLSN >= newest {
		t.Fatalf("A wrote no checkpoint behind B's after waking (last %s, newest %s): the case under test did not happen", last.EndLSN, newest)
	}
	b.Kill9()
	// A takes over: it resumes from B's checkpoint instead of halting, and
	// publishes what is written next.
	before := e2e.EndOffsets(e.Brokers, e.Topic)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('agg-after', $1, '{}')`, e.Topic)
	e2e.WaitFor(t, 2*time.Minute, func() bool { return a.Exited() || e2e.EndOffsets(e.Brokers, e.Topic) > before })
	if a.Exited() {
		out := a.Out.String()
		t.Fatalf("A exited %d when it took over from B, instead of resuming from B's checkpoint; its output ends:\n%s", a.Code, out[max(0, len(out)-3000):])
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("at-least-once zombie: %d events: %s", n, v)
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("zombie: %s", v)
	}
	a.Stop()
}

// checkpointLog reads every record of the one-partition checkpoint topic
// in log order and returns the last checkpoint record written and the
// highest position any checkpoint record holds.
func checkpointLog(t *testing.T, brokers []string, topic string) (last *publisher.Checkpoint, lastKey string, newest pglogrepl.LSN) {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	c, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hwm := e2e.EndOffsets(brokers, topic)
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var top *publisher.Checkpoint
	timeout := time.After(30 * time.Second)
	for off := int64(-1); off < hwm-1; {
		select {
		case m := <-pc.Messages():
			off = m.Offset
			if _, _, ok := publisher.SplitCheckpointKey(string(m.Key)); !ok || m.Value == nil {
				continue // a read barrier, a tombstone
			}
			cp, err := publisher.ParseCheckpoint(m.Value)
			if err != nil {
				t.Fatalf("checkpoint record %q: %v", m.Key, err)
			}
			last, lastKey = cp, string(m.Key)
			if top == nil || cp.EndLSN > top.EndLSN {
				top = cp
			}
		case <-timeout:
			t.Fatalf("reading %s did not reach its high watermark %d", topic, hwm)
		}
	}
	if last == nil {
		t.Fatalf("no checkpoint record in %s", topic)
	}
	return last, lastKey, top.EndLSN
}
