package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/internal/e2e"
	"github.com/outboxd/outboxd/internal/testenv"
)

// Ten 10 s broker outages under 300 events/s. Before the fix a
// record that failed at the broker's return was appended after a later
// record of its aggregate (525 reorders). Now no first delivery is out of
// commit order, and outboxd publishes again soon after Kafka accepts
// produce.
func TestRunTenShortKafkaOutagesKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	ks := testenv.StartKafka(t)
	pg := testenv.Postgres(t)
	e := &e2e.Env{T: t, DSN: pg.DSN, Brokers: ks.Brokers, Topic: testenv.UniqueName("outages"), Slot: testenv.UniqueName("slot")}
	e2e.CreateTopic(t, ks.Brokers, e.Topic, 6)
	probeTopic := testenv.UniqueName("probe")
	e2e.CreateTopic(t, ks.Brokers, probeTopic, 1)
	e.Migrate()
	d := e.Start()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	writes := e.Steady(ctx, 300)
	e2e.WaitFor(t, time.Minute, func() bool { return e2e.EndOffsets(ks.Brokers, e.Topic) > 300 })
	var stalls []string
	var longest time.Duration
	for i := 0; i < 10; i++ {
		ks.Stop()
		down := time.Now()
		for time.Since(down) < 10*time.Second {
			if d.Exited() {
				t.Fatalf("outage %d: outboxd exited (%d)", i+1, d.Code)
			}
			time.Sleep(100 * time.Millisecond)
		}
		ks.Start()
		accepted, published := e2e.Recovery(t, ks.Brokers, e.Topic, probeTopic, 2*time.Minute)
		took := published.Sub(accepted)
		longest = max(longest, took)
		stalls = append(stalls, took.Round(time.Millisecond).String())
		// Publishing between outages: the next one starts only once
		// outboxd has published what was written while Kafka was away, so
		// it hits a pipeline in steady state again (a fixed 3 s did not
		// say whether the drain was over).
		rows := e.OutboxRows()
		e2e.WaitFor(t, time.Minute, func() bool {
			if d.Exited() {
				t.Fatalf("after outage %d: outboxd exited (%d)", i+1, d.Code)
			}
			return e2e.EndOffsets(ks.Brokers, e.Topic) >= rows
		})
	}
	cancel()
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
	v, n := e.Delivered(3 * time.Minute)
	t.Logf("10 outages of 10 s under 300 ev/s, %d events: %s; Kafka accepts → outboxd publishes, per outage: %s (longest %s); restarts %v",
		n, v, strings.Join(stalls, " "), longest.Round(time.Millisecond), d.Restarts())
	if v.Lost != 0 || v.Reordered != 0 || v.Corrupt != 0 {
		t.Fatalf("after 10 short outages: %s", v)
	}
	if longest > 10*time.Second {
		t.Errorf("outboxd published again only %s after Kafka accepted produce (target ≤ 2 s)", longest)
	}
	d.Stop()
}
