package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/outboxd/outboxd/audit"
	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
	"github.com/outboxd/outboxd/kafka"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/poll"
)

// TestMeasureAudit is a measurement, not a timed test ("make bench-audit"):
// the wall time and peak RSS of "outboxd audit" (built without -race) over
// OUTBOXD_BENCH_AUDIT_EVENTS events, rows inserted with generate_series and
// records produced by outboxd's own producer through the replay path
// (in rounds of 2,000: fewer than the producer's results buffer holds, as
// the round is read back only after it was sent). It
// asserts only that the audit is clean; the figures are logged.
func TestMeasureAudit(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("OUTBOXD_BENCH_AUDIT_EVENTS"))
	if n <= 0 {
		t.Skip("a measurement: set OUTBOXD_BENCH_AUDIT_EVENTS=N (make bench-audit)")
	}
	ctx := context.Background()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	topic := k.Topic(t, "auditbench", 6)
	conn := pg.Conn(t)
	if _, err := migrations.Apply(ctx, conn, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, `
		INSERT INTO outbox (aggregate_id, topic, payload, headers)
		SELECT 'agg-' || (i % 10000), $1, jsonb_build_object('n', i, 'pad', repeat('x', 100)),
		       CASE WHEN i % 4 = 0 THEN jsonb_build_object('traceparent', 'tp-' || i) END
		  FROM generate_series(1, $2) AS i ORDER BY i`, topic, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("inserted %d rows in %s", n, time.Since(start).Round(time.Millisecond))

	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = k.Brokers
	prod, err := kafka.NewProducer(kcfg, zap.NewNop(), kafka.ProducerHooks{})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	pcfg := poll.DefaultConfig()
	pcfg.Mapping = outbox.DefaultMapping()
	produced, err := poll.Replay(ctx, conn, pcfg, poll.Range{FromID: 1}, 2000, func(events []outbox.Event) error {
		for i := range events {
			if err := prod.Send(ctx, outbox.NewRecord(&events[i], &pcfg.Mapping, time.Now())); err != nil {
				return err
			}
		}
		for range events {
			if r := <-prod.Results(); r.Err != nil {
				return r.Err
			}
		}
		return nil
	})
	prod.Close()
	for range prod.Results() {
	}
	if err != nil || produced != n {
		t.Fatalf("produced %d of %d: %v", produced, n, err)
	}
	t.Logf("produced %d records in %s", n, time.Since(start).Round(time.Millisecond))

	bins, err := testproc.BuildNoRace(t.TempDir(), "./cmd/outboxd")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bins["outboxd"], "audit", "--pg-dsn", pg.DSN, "--kafka-brokers", strings.Join(k.Brokers, ","), "--from-id", "1", "--json")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start = time.Now()
	err = cmd.Run()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("outboxd audit: %v\n%s%s", err, out.String(), errb.String())
	}
	var rep audit.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || !rep.Clean || rep.Topics[0].Rows != int64(n) {
		t.Fatalf("audit report (%v): %s", err, out.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	peak := ru.Maxrss * 1024 // kilobytes on Linux
	t.Logf("outboxd audit of %d events (6 partitions, ~130 B payloads): %s wall (%.0f events/s), %.1f s CPU, peak RSS %d MiB (entries: 32 B × %d = %d MiB)",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(),
		time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Seconds(), peak>>20, n, (32*int64(n))>>20)
}
