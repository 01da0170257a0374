package main

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/internal/testproc"
)

// Debezium as a source: its PostgreSQL connector with the Outbox Event
// Router on a Kafka Connect standalone worker (Kafka 4.1.1's, Java 17),
// configured by dev/debezium/outbox.properties.tmpl to publish the same
// records as outboxd from the same table (topic from the row, key
// aggregate_id, header outbox-id, value the payload's text) through a slot
// and publication of its own. The worker's jars come from dev/stack
// debezium-deps (Maven Central, cached in .cache/).

// debeziumSource polls its queue every poll (Debezium's default: 500 ms).
func debeziumSource(poll time.Duration) source {
	return source{Name: "debezium-" + poll.String(), Debezium: true, PollMs: int(poll / time.Millisecond)}
}

// debeziumLibs makes sure the jars are fetched and returns their folder.
func debeziumLibs(root string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "dev", "stack"), "debezium-deps")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("dev/stack debezium-deps: %w: %s", err, out)
	}
	libs, err := filepath.Glob(filepath.Join(root, ".cache", "debezium-*", "libs"))
	if err != nil || len(libs) != 1 {
		return "", fmt.Errorf("Debezium's jars: want one .cache/debezium-*/libs, found %v", libs)
	}
	return libs[0], nil
}

// launchDebezium writes the worker's and the connector's configuration
// into a folder of its own and starts the worker. The connector uses slot
// slotName and publication pubName (created by Debezium when missing).
func (r *runner) launchDebezium(db *database, slotName, pubName string, s source) (*testproc.Proc, func(), error) {
	root, err := repoRoot()
	if err != nil {
		return nil, nil, err
	}
	if r.debeziumLibs == "" {
		if r.debeziumLibs, err = debeziumLibs(root); err != nil {
			return nil, nil, err
		}
	}
	dir, err := os.MkdirTemp("", "outboxd-bench-debezium-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	u, err := url.Parse(db.DSN)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	pw, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "dev", "debezium", "outbox.properties.tmpl"))
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	// The worker's REST API, which the bench does not use but Kafka
	// Connect always opens.
	restPort, err := testenv.FreePort()
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	conn := strings.NewReplacer("@PGHOST@", u.Hostname(), "@PGPORT@", port, "@PGUSER@", u.User.Username(), "@PGPASSWORD@", pw,
		"@PGDB@", strings.TrimPrefix(u.Path, "/"), "@SLOT@", slotName, "@PUBLICATION@", pubName,
		"@TABLE@", "public.outbox", "@POLL_MS@", fmt.Sprint(s.PollMs)).Replace(string(tmpl))
	worker := strings.Join([]string{
		"bootstrap.servers=" + strings.Join(r.stack.pubBrokers(), ","),
		"key.converter=org.apache.kafka.connect.storage.StringConverter",
		"value.converter=org.apache.kafka.connect.storage.StringConverter",
		"header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter",
		"offset.storage.file.filename=" + filepath.Join(dir, "offsets"),
		// Debezium confirms its slot's position when the worker flushes
		// offsets: every second here (Kafka Connect's default is 60 s).
		"offset.flush.interval.ms=1000",
		fmt.Sprintf("listeners=http://127.0.0.1:%d", restPort),
		"plugin.discovery=service_load",
		"connector.client.config.override.policy=All",
		"producer.linger.ms=0",
	}, "\n") + "\n"
	wp, cp := filepath.Join(dir, "worker.properties"), filepath.Join(dir, "connector.properties")
	if err := os.WriteFile(wp, []byte(worker), 0o644); err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := os.WriteFile(cp, []byte(conn), 0o600); err != nil {
		cleanup()
		return nil, nil, err
	}
	java := []string{"-Xmx1g", "-Xms256m", "-Djava.awt.headless=true",
		"-Dkafka.logs.dir=" + dir, "-Dkafka.log.file=connect.log",
		"-Dlog4j2.configurationFile=" + filepath.Join(root, "dev", "kafka", "log4j2.properties"),
		"-cp", filepath.Join(r.debeziumLibs, "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone", wp, cp}
	p, err := testproc.Launch("java", java)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return p, cleanup, nil
}

// launch starts source s publishing from slot slotName through publication
// pubName: outboxd, or Debezium's worker. done cleans up after it exited.
//
// outboxd serves its metrics (and with -pprof its profiler) on metrics, so a
// cell can read where its time went (stages.go); Debezium's is "".
func (r *runner) launch(db *database, slotName, pubName string, s source) (p *testproc.Proc, done func(), metrics string, err error) {
	if s.Debezium {
		p, done, err = r.launchDebezium(db, slotName, pubName, s)
		return p, done, "", err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, nil, "", err
	}
	metrics = fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"run", "--pg-dsn", db.DSN, "--kafka-brokers", strings.Join(r.stack.pubBrokers(), ","),
		"--slot", slotName, "--publication", pubName, "--log-level", "info", "--metrics-addr", metrics}
	if r.pprofDir != "" {
		args = append(args, "--pprof")
	}
	args = append(args, s.args()...)
	// A diagnostic hook: extra flags for the publisher.
	args = append(args, strings.Fields(os.Getenv("BENCH_PUBLISHER_ARGS"))...)
	p, err = testproc.Launch(r.bin, args)
	return p, func() {}, metrics, err
}

// cleanExit reports whether a publisher's exit code after SIGTERM is a
// clean stop: 0, or for the JVM 143 (128 + SIGTERM), which Kafka Connect
// returns after its orderly shutdown.
func cleanExit(s source, code int) bool {
	return code == 0 || (s.Debezium && code == 143)
}
