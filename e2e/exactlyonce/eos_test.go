package exactlyonce

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Exactly-once delivery, with real processes. Every consumer here
// reads read_committed (see e2e.Consume).

// kill -9 of outboxd, again and again, under 300 events/s: with the
// checkpoint in the same Kafka transaction as the records, a restart skips
// exactly what was committed, and re-sends exactly what was not.
func TestRunExactlyOnceKill9UnderLoad(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	args := e2e.EOSArgs()
	d := e.Start(args...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 300)
	const kills = 50
	for i := 0; i < kills; i++ {
		// Let it publish for a moment, somewhere inside a Kafka transaction.
		time.Sleep(time.Duration(300+(i*137)%700) * time.Millisecond)
		d.Kill9()
		d = e.Start(args...)
	}
	time.Sleep(time.Second)
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("exactly-once, kill -9 %d times under 300 ev/s, %d events: %s", kills, n, v)
	if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("exactly-once after %d kill -9: %s", kills, v)
	}
	d.Stop()
}

// Fast restarts of Postgres under load, in both modes: on Postgres < 17 a
// restart replays everything since the slot's last persisted position;
// the checkpoint makes outboxd skip what Kafka already has.
func TestRunPostgresRestartsDuplicateNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			ps := testenv.StartPostgres(t)
			k := testenv.Kafka(t)
			e := &e2e.Env{T: t, DSN: ps.DSN, Brokers: k.Brokers, Topic: k.Topic(t, "pgrestarts", 3), Slot: testenv.UniqueName("slot")}
			e.Migrate()
			d := e.Start("--delivery", mode, "--checkpoint-topic", testenv.UniqueName("checkpoints"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			writes := e.Steady(ctx, 300)
			for range 10 {
				time.Sleep(1500 * time.Millisecond)
				ps.Restart("fast")
			}
			time.Sleep(2 * time.Second)
			cancel()
			if err := <-writes; err != nil && !strings.Contains(err.Error(), "connect") && !strings.Contains(err.Error(), "terminat") {
				t.Logf("writer stopped: %v", err) // a writer may meet a restart; what it committed counts
			}
			v, n := e.Delivered(3 * time.Minute)
			t.Logf("%s, 10 Postgres fast restarts under load, %d events: %s; restarts %v", mode, n, v, d.Restarts())
			if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
				t.Fatalf("%s after 10 Postgres restarts: %s", mode, v)
			}
			d.Stop()
		})
	}
}

// Kafka faults in exactly-once mode: the open transaction is aborted by
// the next producer (or by the coordinator's timeout), the checkpoint says
// what committed. A broker killed while commits fly leaves an EndTxn whose
// outcome outboxd cannot know: nothing is confirmed, the restart resolves it.
func TestRunExactlyOnceKafkaFaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		backlog int
		fault   func(ks *testenv.KafkaServer)
	}{
		{"stopped 30 s under load", 0, func(ks *testenv.KafkaServer) { ks.Stop(); time.Sleep(30 * time.Second) }},
		{"killed mid-commit under load", 0, func(ks *testenv.KafkaServer) { ks.Kill(); time.Sleep(5 * time.Second) }},
		{"stopped 30 s in a backlog drain", 100_000, func(ks *testenv.KafkaServer) { ks.Stop(); time.Sleep(30 * time.Second) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ks := testenv.StartKafka(t)
			pg := testenv.Postgres(t)
			e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("eosfault"), Slot: testenv.UniqueName("slot")}
			e2e.CreateTopic(t, ks.Brokers, e.Topic, 3)
			e.Migrate()
			args := e2e.EOSArgs("--kafka-delivery-timeout", "5s")
			d := e.Start(args...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.backlog > 0 {
				d.Stop()
				e.Backlog(c.backlog)
				d = e2e.StartDaemon(t, e.Args(args...)...)
				e2e.WaitFor(t, 2*time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) > int64(c.backlog/5) })
			}
			writes := e.Steady(ctx, 300)
			e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) > 300 })
			c.fault(ks)
			if d.Exited() {
				t.Fatalf("outboxd exited (%d) during the fault", d.Code)
			}
			ks.Start()
			probeTopic := testenv.UniqueName("probe")
			e2e.WaitFor(t, 2*time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) > 0 })
			e2e.CreateTopic(t, ks.Brokers, probeTopic, 1)
			e2e.Recovery(t, ks.Brokers, e.Topic, probeTopic, 2*time.Minute)
			// Publishing after the fault, under the load: until Kafka holds
			// as many records as the outbox held rows (end offsets also
			// count markers: this paces, the verdict below decides).
			rows := e.OutboxRows()
			e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) >= rows })
			cancel()
			if err := <-writes; err != nil {
				t.Fatal(err)
			}
			v, n := e.Delivered(3 * time.Minute)
			t.Logf("exactly-once, Kafka %s, %d events: %s; restarts %v", c.name, n, v, d.Restarts())
			if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
				t.Fatalf("exactly-once, Kafka %s: %s", c.name, v)
			}
			d.Stop()
		})
	}
}

// One Postgres transaction of 200,000 rows fits one Kafka transaction.
func TestRunExactlyOnceHugeTransaction(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 6)
	d := e.Start(e2e.EOSArgs()...)
	d.Stop()
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload)
		SELECT 'agg-' || (g % 100), $1, jsonb_build_object('seq', g) FROM generate_series(1, 200000) AS g ORDER BY g`, e.Topic)
	d = e.Start(e2e.EOSArgs()...)
	v, n := e.Delivered(5 * time.Minute)
	t.Logf("exactly-once, one 200,000-row transaction: %d events: %s", n, v)
	if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 || n != 200000 {
		t.Fatalf("exactly-once, one huge transaction: %s", v)
	}
	d.Stop()
}

// A zombie: outboxd A is frozen (SIGSTOP) while the server drops its
// connection; B takes the slot over and publishes. When A wakes up, its
// transactional id was fenced by B: it can commit and confirm nothing.
func TestRunExactlyOnceZombieIsFenced(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 3)
	cp := testenv.UniqueName("checkpoints")
	args := []string{"--delivery", "exactly-once", "--checkpoint-topic", cp}
	a := e.Start(args...)
	b := e2e.StartDaemon(t, e.Args(args...)...)
	b.WaitLog("standby", 60*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 300)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > 300 })
	_ = syscall.Kill(a.PID(), syscall.SIGSTOP)
	// The server drops the frozen process's walsender (as wal_sender_timeout
	// would): the slot is free for the standby.
	e.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1`, e.Slot)
	b.WaitLog("taking over", 60*time.Second)
	e2e.WaitFor(t, time.Minute, func() bool { return strings.Count(b.Out.String(), "streaming") >= 1 })
	e.WaitPublishing(300, time.Minute) // B publishes and commits
	_ = syscall.Kill(a.PID(), syscall.SIGCONT)
	time.Sleep(5 * time.Second)
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	outcome := "still running (a standby again)"
	if a.Exited() {
		outcome = fmt.Sprintf("exited %d", a.Code)
	}
	t.Logf("zombie A resumed after B took over, %d events: %s; A %s, fenced in its log: %v",
		n, v, outcome, strings.Contains(a.Out.String(), "fenced"))
	if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("zombie: %s", v)
	}
	// A never publishes again as the active instance. Either it learns it
	// was fenced (PRODUCER_FENCED) and stops for good, or the broker answers
	// its old epoch with INVALID_PRODUCER_EPOCH, which outboxd takes for a
	// lost transaction (also what a coordinator's timeout abort says, KIP-588):
	// A's session restarts and finds B holding the slot, so A waits as a
	// standby. Both are safe: the slot is the lock, and the counts above
	// show nothing lost or duplicated.
	fenced := func() bool { return a.Exited() && a.Code != 0 && strings.Contains(a.Out.String(), "fenced") }
	standby := func() bool {
		out := a.Out.String()
		return !a.Exited() && strings.LastIndex(out, "standby: another process holds the slot") > strings.LastIndex(out, "streaming")
	}
	e2e.WaitFor(t, 30*time.Second, func() bool { return fenced() || standby() })
	b.Stop()
}

// Gaps are never silent: the slot advanced by someone else while outboxd
// was stopped is refused with both positions named; --accept-gap starts.
func TestRunRefusesAGapBetweenCheckpointAndSlot(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	cp := testenv.UniqueName("checkpoints")
	d := e.Start("--checkpoint-topic", cp)
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('agg-1', $1, '{}')`, e.Topic)
	e.Delivered(time.Minute)
	d.Stop()
	// Someone advances the slot past events outboxd never saw.
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) VALUES ('agg-1', $1, '{"lost": true}')`, e.Topic)
	e.Exec(`SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, e.Slot)
	refused := e2e.StartDaemon(t, e.Args("--checkpoint-topic", cp)...)
	code := refused.Wait(60 * time.Second)
	out := refused.Out.String()
	if code == 0 || !strings.Contains(out, "gap between the checkpoint and the slot") || !strings.Contains(out, "--accept-gap") {
		t.Fatalf("exit %d, output:\n%s\nwant a refusal naming the gap and --accept-gap", code, out)
	}
	// outboxd status shows the checkpoint next to the slot and the same gap.
	code, out = e2e.RunOnce(t, "status", "--pg-dsn", e.DSN, "--slot", e.Slot, "--publication", e.Slot, "--allow-inactive",
		"--kafka-brokers", strings.Join(e.Brokers, ","), "--checkpoint-topic", cp)
	if code != 1 || !strings.Contains(out, "checkpoint") || !strings.Contains(out, "ahead of outboxd's checkpoint") || !strings.Contains(out, "read in") {
		t.Errorf("status: exit %d\n%s\nwant the checkpoint (and its read time) and the gap as a problem", code, out)
	}
	accepted := e.Start("--checkpoint-topic", cp, "--accept-gap")
	accepted.Stop()
}
