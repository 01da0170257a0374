package cluster

// Many deployments on one replicated Kafka: one private 3-node
// cluster, started once, its subtests one after another (three brokers and
// five race-built outboxd are plenty for a small machine); the test itself
// runs beside the package's others rather than holding them back.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

func TestSharedCluster(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	c := testenv.StartKafkaCluster(t, 3)
	t.Logf("3-node cluster up in %s", time.Since(begin).Round(time.Millisecond))
	t.Run("FiveExactlyOnceDeploymentsKilledAndRestarted", func(t *testing.T) { fiveDeployments(t, c) })
	t.Run("LeaderPausedPastTheTxnTimeout", func(t *testing.T) {
		leaderPausedPastTxnTimeout(t, c, pauseCase{delivery: 5 * time.Second, txn: 10 * time.Second, pause: 25 * time.Second})
	})
	t.Run("CoordinatorPausedPastTheTxnTimeout", func(t *testing.T) {
		// A delivery timeout above the 15 s a request to a frozen broker
		// takes to fail: the records, then the EndTxn, each wait for it,
		// so the transaction is past its timeout when the EndTxn reaches
		// the coordinator that took over.
		leaderPausedPastTxnTimeout(t, c, pauseCase{coordinator: true, delivery: 20 * time.Second, txn: 25 * time.Second, pause: 45 * time.Second})
	})
	t.Run("TopicDeletedUnderLoadThenRecreated", func(t *testing.T) { topicDeletedUnderLoad(t, c) })
	t.Run("TopicDeletedUnderLoadDeadLettered", func(t *testing.T) { topicDeletedDeadLettered(t, c) })
	t.Logf("shared cluster: %s in all", time.Since(begin).Round(time.Second))
}

// deployment is one outboxd deployment of the shared cluster: its database,
// slot and topic, its process, its load.
type deployment struct {
	name   string
	e      *e2e.Env
	d      *e2e.Daemon
	args   []string
	writes <-chan error
	// restartTimes are how long each restart took to be ready to publish
	// (start → "checkpoint read": the slot, the fence, the checkpoint
	// read; "streaming" is logged when the slot is open, before both).
	restartTimes []time.Duration
	kills, stops int
	exits        []string // every exit but ours: there must be none
}

// start starts (or restarts) the deployment's outboxd and records how long
// it took to stream.
func (dp *deployment) start() {
	began := time.Now()
	dp.d = dp.e.Start(dp.args...)
	dp.d.WaitLog("checkpoint read", time.Minute)
	dp.restartTimes = append(dp.restartTimes, time.Since(began))
}

// publishes waits until n more records are in the deployment's topic;
// it fails at once, with outboxd's last lines, if outboxd exited.
func (dp *deployment) publishes(t *testing.T, n int64) {
	t.Helper()
	base := e2e.EndOffsets(dp.e.Brokers, dp.e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool {
		if dp.d.Exited() {
			t.Fatalf("%s: outboxd exited (%d):\n%s", dp.name, dp.d.Code, dp.d.P.Tail(10))
		}
		return e2e.EndOffsets(dp.e.Brokers, dp.e.Topic) >= base+n
	})
}

// alive notes an exit nobody asked for.
func (dp *deployment) alive() {
	if dp.d.Exited() && !slices.Contains(dp.exits, dp.d.Out.String()) {
		dp.exits = append(dp.exits, dp.d.Out.String())
	}
}

// Five exactly-once deployments (five databases, one outboxd each) share
// the cluster and its default checkpoint topic (outboxd.checkpoints, one
// partition), each publishing ~50 events/s. Several are killed with -9 or
// stopped cleanly and started again while the others — and a killed one —
// hold open transactions, on their data topics and on the shared checkpoint
// partition. For each deployment: 0 lost, 0 duplicates (read_committed), no
// reordering, no exit we did not cause, no halt or fencing in its log.
func fiveDeployments(t *testing.T, c *testenv.KafkaCluster) {
	began := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ds := make([]*deployment, 5)
	for i := range ds {
		pg := testenv.Postgres(t)
		e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: c.Brokers(), Topic: c.CreateTopic(t, fmt.Sprintf("shared%d", i), 3),
			Slot: testenv.UniqueName("slot")}
		e.Migrate()
		// The default checkpoint topic: shared by all five.
		ds[i] = &deployment{name: fmt.Sprintf("d%d", i), e: e, args: []string{"--delivery", "exactly-once"}}
	}
	// The five first starts at once (each creates its slot, one the
	// checkpoint topic): one after another they took five start-ups.
	for _, dp := range ds {
		dp.d = e2e.StartDaemon(t, dp.e.Args(dp.args...)...)
	}
	for _, dp := range ds {
		dp.d.WaitLog("streaming", 60*time.Second)
		dp.d.WaitLog("checkpoint read", time.Minute)
		dp.writes = dp.e.Steady(ctx, 50)
	}
	for _, dp := range ds {
		dp.publishes(t, 50)
	}
	t.Logf("five deployments publishing after %s", time.Since(began).Round(time.Millisecond))

	// Rounds: kill -9 one of d0/d1 (mid-transaction: they publish all the
	// time), restart one of d2/d3 cleanly while the killed one is still
	// down (its open transaction may hold the shared checkpoint partition),
	// then start the killed one. d4 is never touched.
	var openAtFaults []int
	const rounds = 6
	for r := range rounds {
		killed, restarted := ds[r%2], ds[2+r%2]
		// Each round waits until the victims published since the last one.
		for _, dp := range []*deployment{killed, restarted} {
			dp.publishes(t, 20)
		}
		openAtFaults = append(openAtFaults, len(ongoingTxns(t, c.Brokers())))
		killed.d.Kill9()
		killed.kills++
		restarted.d.Stop()
		restarted.stops++
		restarted.start()
		killed.start()
		for _, dp := range ds {
			dp.alive()
		}
	}
	// The last round, on purpose: d0 killed while its transaction holds
	// the shared checkpoint partition (frozen, seen open there, then
	// killed), and left down, so that its transaction stays open for its
	// whole --kafka-txn-timeout (5 min). d2 and d3 restart meanwhile:
	// their checkpoint reads must neither wait for it nor miss their own
	// latest checkpoint behind it.
	holder := ds[0]
	holder.publishes(t, 20)
	attempts := killInCheckpointWindow(t, c.Brokers(), holder)
	holder.kills++
	var pastHolder []string
	for _, dp := range ds[2:4] {
		dp.publishes(t, 20)
		if !txnOpenOnCheckpoints(t, c.Brokers(), holder.e.Slot) {
			t.Fatalf("%s's transaction no longer holds the checkpoint partition", holder.name)
		}
		dp.d.Stop()
		dp.stops++
		dp.start()
		took := dp.restartTimes[len(dp.restartTimes)-1]
		pastHolder = append(pastHolder, fmt.Sprintf("%s %s", dp.name, took.Round(10*time.Millisecond)))
		if took > 15*time.Second {
			t.Errorf("%s took %s to read its checkpoint while %s's transaction held the checkpoint partition", dp.name, took, holder.name)
		}
	}
	t.Logf("%s killed with its transaction open on the checkpoint partition (attempt %d); restarted past it: %s",
		holder.name, attempts, strings.Join(pastHolder, ", "))
	holder.start()

	// Let everyone publish a while after the last fault, then stop the load.
	for _, dp := range ds {
		dp.publishes(t, 50)
	}
	cancel()
	for _, dp := range ds {
		if err := <-dp.writes; err != nil {
			t.Fatalf("%s load: %v", dp.name, err)
		}
	}
	var lines []string
	for _, dp := range ds {
		dp.alive()
		v, n := dp.e.Delivered(3 * time.Minute)
		out := dp.d.Out.String()
		restarts := dp.d.Restarts()
		times := make([]string, len(dp.restartTimes))
		for i, d := range dp.restartTimes {
			times[i] = d.Round(10 * time.Millisecond).String()
		}
		lines = append(lines, fmt.Sprintf("%s: %d events, %s; kill -9 %d, clean restarts %d, start→checkpoint read [%s], restarts in the last run %v",
			dp.name, n, v, dp.kills, dp.stops, strings.Join(times, " "), restarts))
		if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
			t.Errorf("%s: %s", dp.name, v)
		}
		for _, exit := range dp.exits {
			t.Errorf("%s exited by itself:\n%s", dp.name, exit[max(0, len(exit)-3000):])
		}
		if strings.Contains(out, "halting") || strings.Contains(out, "fenced") {
			t.Errorf("%s halted or called itself fenced:\n%s", dp.name, dp.d.P.Tail(30))
		}
	}
	for _, dp := range ds {
		dp.d.Stop()
	}
	t.Logf("five exactly-once deployments, one cluster, one checkpoint topic, %d rounds of kill -9 + clean restart "+
		"(ongoing transactions in the cluster at each fault: %v), %s in all:\n%s",
		rounds, openAtFaults, time.Since(began).Round(time.Second), strings.Join(lines, "\n"))
	if slices.Max(openAtFaults) == 0 {
		t.Errorf("no transaction was open at any fault: the case was not exercised")
	}
}

// killInCheckpointWindow kills dp's outboxd while its Kafka transaction
// is open on the shared checkpoint partition: it freezes the process, and
// kills it if that transaction is still open a moment later (nothing can
// end it then but the coordinator's timeout), else lets it run and tries
// again. It returns the attempts it took.
func killInCheckpointWindow(t *testing.T, brokers []string, dp *deployment) int {
	t.Helper()
	for attempt := 1; attempt <= 300; attempt++ {
		_ = syscall.Kill(dp.d.PID(), syscall.SIGSTOP)
		if txnOpenOnCheckpoints(t, brokers, dp.e.Slot) {
			// An EndTxn sent just before the freeze still completes: ask
			// again once it would have.
			deadline := time.Now().Add(500 * time.Millisecond)
			open := true
			for open && time.Now().Before(deadline) {
				open = txnOpenOnCheckpoints(t, brokers, dp.e.Slot)
			}
			if open {
				dp.d.Kill9()
				return attempt
			}
		}
		_ = syscall.Kill(dp.d.PID(), syscall.SIGCONT)
		dp.publishes(t, 1)
	}
	t.Fatalf("%s was never caught with its transaction open on the checkpoint partition", dp.name)
	return 0
}

// txnOpenOnCheckpoints reports whether the transactional id of the
// deployment of slot has a transaction open on outboxd.checkpoints.
func txnOpenOnCheckpoints(t *testing.T, brokers []string, slot string) bool {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const topic = "outboxd.checkpoints"
	leader, err := client.Leader(topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := leader.DescribeProducers(&sarama.DescribeProducersRequest{
		Topics: []sarama.DescribeProducersRequestTopic{{Name: topic, PartitionIndexes: []int32{0}}}})
	if err != nil {
		t.Fatal(err)
	}
	var open []int64
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			for _, ps := range p.ActiveProducers {
				if ps.CurrentTxnStartOffset >= 0 {
					open = append(open, ps.ProducerID)
				}
			}
		}
	}
	if len(open) == 0 {
		return false
	}
	for _, b := range client.Brokers() {
		_ = b.Open(cfg)
		lt, err := b.ListTransactions(&sarama.ListTransactionsRequest{ProducerIDFilters: open, DurationFilter: -1})
		if err != nil {
			continue
		}
		for _, ts := range lt.TransactionStates {
			if strings.HasSuffix(ts.TransactionalID, slot) && ts.TransactionState == "Ongoing" {
				return true
			}
		}
	}
	return false
}

// ongoingTxns lists the transactional ids with a transaction open
// (state Ongoing) on any broker of the cluster.
func ongoingTxns(t *testing.T, brokers []string) []string {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var out []string
	for _, b := range client.Brokers() {
		_ = b.Open(cfg)
		resp, err := b.ListTransactions(&sarama.ListTransactionsRequest{StateFilters: []string{"Ongoing"}, DurationFilter: -1})
		if err != nil {
			continue // a broker that is down coordinates nothing we can see
		}
		for _, ts := range resp.TransactionStates {
			out = append(out, ts.TransactionalID)
		}
	}
	return out
}

// coordinatorOf returns the index of the node coordinating a transactional
// id (the test's only one on the cluster), -1 if none does yet.
func coordinatorOf(t *testing.T, c *testenv.KafkaCluster) int {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V4_1_0_0
	for i := range c.Len() {
		b := sarama.NewBroker(c.Node(i).Brokers[0])
		if err := b.Open(cfg); err != nil {
			continue
		}
		resp, err := b.ListTransactions(&sarama.ListTransactionsRequest{DurationFilter: -1})
		_ = b.Close()
		if err == nil && len(resp.TransactionStates) > 0 {
			return i
		}
	}
	return -1
}

// pauseCase is a node frozen for longer than the transaction timeout.
type pauseCase struct {
	coordinator          bool // the transaction coordinator, else a leader that is not it
	delivery, txn, pause time.Duration
}

// One exactly-once deployment under ~100 events/s, its transactions always
// open; a node is frozen with SIGSTOP for longer than the lowered
// --kafka-txn-timeout, so the open transaction outlives its timeout:
// either the leader of one of its partitions that is not the transaction
// coordinator (the coordinator aborts the transaction while the leader is
// away), or the coordinator itself (the node that takes its transactions
// over aborts it, and outboxd's EndTxn may meet the bumped epoch). Then:
// outboxd recovers without halting or a restart loop, and the topic holds
// every event once (read_committed).
func leaderPausedPastTxnTimeout(t *testing.T, c *testenv.KafkaCluster, pc pauseCase) {
	coordinator := pc.coordinator
	began := time.Now()
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: c.Brokers(), Topic: c.CreateTopic(t, "txnleader", 3), Slot: testenv.UniqueName("slot")}
	e.Migrate()
	probeTopic := c.CreateTopic(t, "probe", 1)
	txnTimeout := pc.txn
	d := e.Start(e2e.EOSArgs("--kafka-delivery-timeout", pc.delivery.String(), "--kafka-txn-timeout", txnTimeout.String())...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 100)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) >= 200 })
	var coord int
	e2e.WaitFor(t, 30*time.Second, func() bool { coord = coordinatorOf(t, c); return coord >= 0 })
	victim, leads := -1, false
	for p := range int32(3) {
		l := c.LeaderOf(e.Topic, p)
		if coordinator && l == coord {
			leads = true
		}
		if !coordinator && l != coord && l >= 0 {
			victim = l
			break
		}
	}
	if coordinator {
		victim = coord
		t.Logf("pausing the coordinator, node %d (leads a partition of the topic: %v)", coord, leads)
	} else if victim < 0 {
		victim = c.LeaderOf(e.Topic, 0)
		t.Logf("every partition is led by the coordinator (node %d): pausing it", coord)
	}
	pausedAt, paused := time.Now(), true
	c.Node(victim).Pause()
	defer func() {
		if paused { // a failure: give the node back
			c.Node(victim).Resume()
		}
	}()
	for time.Since(pausedAt) < pc.pause { // the fault's length, watching outboxd
		if d.Exited() {
			t.Fatalf("outboxd exited (%d) while node %d was paused:\n%s", d.Code, victim, d.P.Tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Node(victim).Resume()
	resumed := time.Now()
	paused = false
	c.WaitInSync(e.Topic)
	accepted, published := e2e.Recovery(t, e.Brokers, e.Topic, probeTopic, 2*time.Minute)
	// A few more seconds of load: no restart loop after recovery.
	restartsAfter := 0
	for _, n := range d.Restarts() {
		restartsAfter += n
	}
	base := e2e.EndOffsets(e.Brokers, e.Topic)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(e.Brokers, e.Topic) > base+300 })
	restartsLater := 0
	for _, n := range d.Restarts() {
		restartsLater += n
	}
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	out := d.Out.String()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "restarting pipeline") || strings.Contains(l, "transaction") && strings.Contains(l, "ERROR") {
			t.Logf("outboxd: %.900s", l)
		}
	}
	t.Logf("node %d (coordinator node %d) paused %s > --kafka-txn-timeout %s (--kafka-delivery-timeout %s): %d events, %s; "+
		"resume → Kafka accepts %s, → outboxd publishes %s; restarts %v (%d after recovery); "+
		"txn timeouts in the log %d; %s in all",
		victim, coord, pc.pause, txnTimeout, pc.delivery, n, v, accepted.Sub(resumed).Round(time.Millisecond), published.Sub(accepted).Round(time.Millisecond),
		d.Restarts(), restartsLater-restartsAfter, strings.Count(out, "--kafka-txn-timeout"), time.Since(began).Round(time.Second))
	if v.Lost != 0 || v.Duplicated != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Errorf("%s", v)
	}
	if d.Exited() || strings.Contains(out, "halting") {
		t.Fatalf("outboxd halted (exit %d):\n%s", d.Code, d.P.Tail(30))
	}
	if restartsLater-restartsAfter > 0 {
		t.Errorf("outboxd restarted %d times after it had recovered: a restart loop", restartsLater-restartsAfter)
	}
	d.Stop()
}
