package operations

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxd/outboxd/internal/e2e"
)

// TestRunContinuousAudit: with --audit-interval the active instance audits
// the rows of each window against Kafka: clean rounds while everything is
// delivered; records removed from Kafka (DeleteRecords, what a topic's
// retention or an operator's mistake does) become a missing verdict in the
// metrics and a log line with the command that shows and repairs them.
func TestRunContinuousAudit(t *testing.T) {
	t.Parallel()
	e := e2e.NewEnv(t, 1)
	addr := e2e.ClosedPort(t)
	d := e.Start("--metrics-addr", addr, "--audit-interval", "500ms", "--audit-delay", "1s")
	defer d.Stop()
	base := "http://" + addr
	until := func(what string, ok func(m map[string]float64) bool) map[string]float64 {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			m := e2e.Scrape(t, base)
			if ok(m) {
				return m
			}
			if time.Now().After(deadline) || d.Exited() {
				t.Fatalf("%s: not within 90 s (exited: %v); metrics: runs clean %v verdict %v skipped %v error %v, rows %v, missing %v\n%s", what, d.Exited(),
					m[`outboxd_audit_runs_total{result="clean"}`], m[`outboxd_audit_runs_total{result="verdict"}`],
					m[`outboxd_audit_runs_total{result="skipped"}`], m[`outboxd_audit_runs_total{result="error"}`],
					m["outboxd_audit_rows_total"], m[`outboxd_audit_verdicts_total{verdict="missing"}`], d.Out.String())
			}
			time.Sleep(100 * time.Millisecond) // polling the metrics with a deadline
		}
	}

	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload) SELECT 'a' || (i % 3), $1, jsonb_build_object('i', i) FROM generate_series(1, 20) i`, e.Topic)
	until("20 rows audited clean", func(m map[string]float64) bool {
		return m["outboxd_audit_rows_total"] >= 20 && m[`outboxd_audit_runs_total{result="clean"}`] >= 1
	})

	// Rows created 3 s ahead: published now, audited by a later window.
	// Their records are then deleted from Kafka.
	e.Exec(`INSERT INTO outbox (aggregate_id, topic, payload, created_at) SELECT 'b', $1, jsonb_build_object('i', i), now() + interval '3 seconds' FROM generate_series(1, 5) i`, e.Topic)
	if code, body := httpFence(t, addr, walLSN(e), "60s"); code != 200 {
		t.Fatalf("fence before the deletion: %d %q", code, body)
	}
	deleteAllRecords(t, e.Brokers, e.Topic)
	m := until("the deleted records found missing", func(m map[string]float64) bool {
		return m[`outboxd_audit_verdicts_total{verdict="missing"}`] >= 5
	})
	if got := m[`outboxd_audit_verdicts_total{verdict="missing"}`]; got != 5 {
		t.Errorf("%v missing, want exactly the 5 deleted", got)
	}
	if m[`outboxd_audit_runs_total{result="verdict"}`] < 1 {
		t.Errorf("no round counted as a verdict")
	}
	if out := d.Out.String(); !strings.Contains(out, "continuous audit: events not delivered") || !strings.Contains(out, "outboxd audit --since") {
		t.Errorf("the verdict was not logged with its command:\n%s", out)
	}
}

// deleteAllRecords deletes every record of topic's partitions (DeleteRecords
// up to each high watermark).
func deleteAllRecords(t *testing.T, brokers []string, topic string) {
	t.Helper()
	sc := sarama.NewConfig()
	sc.Version = sarama.V4_1_0_0
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	offsets := map[int32]int64{}
	for _, p := range parts {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		offsets[p] = hw
	}
	if err := admin.DeleteRecords(topic, offsets); err != nil {
		t.Fatalf("delete the records of %s: %v", topic, err)
	}
}
