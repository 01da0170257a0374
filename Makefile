# outboxd developer entry points. The dev stack (PostgreSQL + Kafka as plain
# local processes) is managed by dev/stack; see `dev/stack help`.

SHELL := /bin/bash
GO    ?= go
STACK := dev/stack

.PHONY: all build deps up down test demo unit lint docs

all: build

## build: compile the binaries under cmd/ into bin/
VERSION_LDFLAGS := -X main.commit=$(shell git rev-parse --short=12 HEAD 2>/dev/null) -X main.version=$(shell git describe --tags --always --dirty 2>/dev/null)
build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/ ./cmd/...

## docs: regenerate the settings tables of docs/configuration.md from the flag
## table (cmd/outboxd); TestConfigurationDocsAreGenerated fails until it is run
docs:
	$(GO) run ./cmd/outboxd docs docs/configuration.md

## deps: install apt packages if missing, fetch the Kafka jars and Go modules
deps:
	$(STACK) deps
	$(GO) mod download
	$(GO) mod download -C bench

## up: start the dev stack (idempotent) and write .devstack.env
up:
	$(STACK) up

## down: stop the dev stack and remove its data
down:
	$(STACK) down

## unit: every test that needs no server (-short skips the rest), in
## seconds, without root or a stack; bench/ is a module of its own
## (gonum/plot stays out of outboxd's go.mod), so it is run from its folder
## (-vet=off: go test's vet pass was a third of the target's CPU, and make lint
## runs go vet on both modules)
unit:
	env -u CI $(GO) test -short -count=1 -vet=off ./...
	env -u CI $(GO) test -C bench -short -count=1 -vet=off ./...

## sim: the whole-pipeline simulation (internal/sim) over SEEDS seeds from
## SIM_FIRST, SIM_PARALLEL at once, without a stack (SIM_RACE=-race adds
## the race detector); make test runs its small fixed set (TestSim). A
## failing seed prints the command that replays it.
SEEDS ?= 50
SIM_FIRST ?= 1000
SIM_PARALLEL ?= 8
SIM_RACE ?=
.PHONY: sim
sim:
	$(GO) test $(SIM_RACE) -count=1 -timeout 0 -parallel $(SIM_PARALLEL) -run '^TestSim$$' ./internal/sim -sim.seeds=$(SEEDS) -sim.first=$(SIM_FIRST) -sim.parallel

## lint: go vet and staticcheck (pinned, run through the module proxy) of
## both modules (outboxd's and bench/'s), shellcheck of the shell scripts,
## and deploy/ checked by promtool and kubernetes-validate (dev/stack
## deploy-check)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SHELL_SCRIPTS := dev/stack $(wildcard dev/stack.d/*.sh) dev/versions examples/demo.sh .ci/run
lint:
	$(STACK) lint-deps
	$(GO) vet ./...
	$(GO) vet -C bench ./...
	$(GO) run $(STATICCHECK) ./...
	cd bench && $(GO) run $(STATICCHECK) ./...
	shellcheck $(SHELL_SCRIPTS)
	$(STACK) deploy-check

## test: lint, then run every test against a fresh dev stack. The stack is taken
## down on every exit path (the EXIT trap), and make still fails when vet or a
## test fails: the recipe exits with the first failing group's status.
## The end-to-end tests mostly wait (on servers, on faults that last), so
## more of them run at once than the machine has cores, and the four groups
## — outboxd's module, bench/'s, the PostgreSQL 17 core tests on a server of
## their own, the cluster tests (e2e-clusters) — run side by side; the last
## three print their output when done. The outboxd binary they run is built
## once, with the race detector, and handed to every package of every group
## (OUTBOXD_TEST_BINARY), instead of one build per package.
TEST_PARALLEL ?= 4
test: deps lint
	@set -uo pipefail; \
	bindir=$$(mktemp -d /tmp/outboxd-test-bin-XXXXXX); \
	trap '$(STACK) down; rm -rf "'"$$bindir"'"' EXIT; \
	$(STACK) up || exit 1; \
	set -a; source ./.devstack.env; set +a; \
	began=$$SECONDS; \
	echo "go build -race -o $$bindir/ ./cmd/outboxd (the binary under test: OUTBOXD_TEST_BINARY)"; \
	$(GO) build -race -o "$$bindir/" ./cmd/outboxd || exit 1; \
	export OUTBOXD_TEST_BINARY="$$bindir/outboxd"; \
	echo "make e2e-clusters > .cache/test-clusters.log"; \
	$(MAKE) --no-print-directory e2e-clusters > .cache/test-clusters.log 2>&1 & clusters=$$!; \
	echo "go test -C bench -race -count=1 -timeout 15m ./... (TestQuickBenchmark: make bench-quick) > .cache/test-bench.log"; \
	$(GO) test -C bench -race -count=1 -timeout 15m ./... > .cache/test-bench.log 2>&1 & bench=$$!; \
	echo "make e2e-pg17 > .cache/test-pg17.log"; \
	$(MAKE) --no-print-directory e2e-pg17 > .cache/test-pg17.log 2>&1 & pg17=$$!; \
	echo "go test -race -count=1 -parallel $(TEST_PARALLEL) -timeout 35m (every package but ./e2e/cluster/) (timings: make test-times)"; \
	: > .cache/test-cpu.txt; \
	CPUTIME_FILE=$$PWD/.cache/test-cpu.txt $(GO) test -race -count=1 -parallel $(TEST_PARALLEL) -timeout 35m \
		-json -exec $$PWD/dev/cputime $$($(GO) list ./... | grep -vx '$(E2E_CLUSTERS_PKG)') 2>&1 | $(GO) run ./dev/testtimes -echo -save .cache/test-times.json; \
	main=$$?; \
	echo "outboxd's module: exit $$main after $$((SECONDS - began)) s"; \
	$(MAKE) --no-print-directory test-times; \
	wait $$clusters; clustersrc=$$?; cat .cache/test-clusters.log; \
	echo "cluster tests (./e2e/cluster/): exit $$clustersrc after $$((SECONDS - began)) s"; \
	wait $$bench; benchrc=$$?; cat .cache/test-bench.log; \
	echo "bench/: exit $$benchrc after $$((SECONDS - began)) s"; \
	wait $$pg17; pg17rc=$$?; cat .cache/test-pg17.log; \
	echo "PostgreSQL 17 core tests: exit $$pg17rc after $$((SECONDS - began)) s"; \
	for rc in $$main $$clustersrc $$benchrc $$pg17rc; do [ "$$rc" = 0 ] || exit "$$rc"; done

## e2e-clusters: the tests on Kafka clusters of their own (./e2e/cluster/):
## broker faults on a private 3-node cluster, many deployments on one, ten
## outages of a private broker. make test runs the package as a group of its
## own from its start: its tests are the longest of the suite (7 min for the
## broker faults), and in the pool of one package's -parallel slots, which Go
## releases in an order of its own, they could only end up last. Its Kafka
## servers are private; its databases (on the dev stack's PostgreSQL) are its
## own too. Needs the dev stack (make up).
E2E_CLUSTERS_PKG := github.com/outboxd/outboxd/e2e/cluster
.PHONY: e2e-clusters
e2e-clusters:
	@set -euo pipefail; \
	set -a; source ./.devstack.env; set +a; \
	echo "go test ./e2e/cluster/"; \
	$(GO) test -race -count=1 -timeout 20m ./e2e/cluster/

## test-times: where the last make test's time went — the slowest packages
## (wall and CPU) and tests, from its go test -json output
.PHONY: test-times
test-times:
	@$(GO) run ./dev/testtimes -top 30 -cpu .cache/test-cpu.txt < .cache/test-times.json

## e2e-pg17: the core end-to-end tests again on PostgreSQL 17 (a private
## server from Maven Central next to the dev stack's Kafka): publish, clean
## stop, kill -9, stop inside a transaction, a huge transaction, standby
## takeover, preflight and poison errors, exactly-once kill -9, a frozen
## walsender, idle WAL, the table-less outbox, the Debezium format, from five
## packages of e2e/ (one binary for all five: make test's, or one built
## here). Needs the dev stack (make up).
E2E_PG17_PKGS := ./e2e/delivery/ ./e2e/exactlyonce/ ./e2e/faults/ ./e2e/formats/ ./e2e/operations/
E2E_PG17 := ^TestRun(PublishesEveryEventOnceInPerKeyOrder|CleanStopAndRestartLosesAndDuplicatesNothing|Kill9FiveTimesLosesNothing|StopInsideATransactionFinishesItFirst|PublishesOneHugeTransaction|StandbyTakesOverWhenActiveIsKilled|PreflightErrors|PoisonEvents|ExactlyOnceKill9UnderLoad|RestartsWhenTheWalsenderFreezes|IdleOutboxDoesNotPinWAL|TablelessOutbox|TablelessKill9LosesNothing|DebeziumFormat)$$
.PHONY: e2e-pg17
e2e-pg17:
	@set -euo pipefail; \
	dir=$$(mktemp -d /tmp/outboxd-pg17-XXXXXX); chmod 755 "$$dir"; port=$$($(STACK) free-port); \
	trap '$(STACK) pg-stop "'"$$dir"'" immediate >/dev/null 2>&1 || true; rm -rf "'"$$dir"'"' EXIT; \
	$(STACK) pg-init "$$dir" "$$port" --version 17; $(STACK) pg-start "$$dir"; \
	set -a; source ./.devstack.env; set +a; \
	export OUTBOXD_PG_DSN="postgres://postgres@127.0.0.1:$$port/postgres?sslmode=disable"; \
	if [ -z "$${OUTBOXD_TEST_BINARY:-}" ]; then \
		bindir=$$(mktemp -d /tmp/outboxd-pg17-bin-XXXXXX); \
		trap '$(STACK) pg-stop "'"$$dir"'" immediate >/dev/null 2>&1 || true; rm -rf "'"$$dir"'" "'"$$bindir"'"' EXIT; \
		$(GO) build -race -o "$$bindir/" ./cmd/outboxd; export OUTBOXD_TEST_BINARY="$$bindir/outboxd"; \
	fi; \
	echo "go test (PostgreSQL 17) -run '$(E2E_PG17)' $(E2E_PG17_PKGS)"; \
	$(GO) test -race -count=1 -timeout 15m -run '$(E2E_PG17)' $(E2E_PG17_PKGS)

## test-pg14 / test-pg16 / test-pg17: outboxd's PostgreSQL-version tests
## (e2e/faults TestRunOnPostgresVersion, TestFailover*) on a private server of
## that major from Maven Central, beside the dev stack's Kafka (make test runs
## them on 17). On 14 they add a flood of empty transactions.
.PHONY: test-pg14 test-pg16 test-pg17
test-pg14 test-pg16 test-pg17: deps
	@set -euo pipefail; \
	if [ ! -f .devstack.env ]; then trap '$(STACK) down' EXIT; fi; \
	$(STACK) with env OUTBOXD_TEST_PG_VERSION=$(@:test-pg%=%) $(GO) test -race -count=1 -timeout 15m \
		-run '^(TestRunOnPostgresVersion|TestFailover.*)$$' -v ./e2e/faults/

## ---- The demo (README.md, "The demo"): examples/demo.sh does each step on
## the dev stack, in a database, slot, topics and group of its own.
DEMO  := examples/demo.sh
COUNT ?= 100

.PHONY: examples db-init topic-create run-service chaos-kill-publisher run-publisher \
	run-consumer db-count outbox-count outbox-pending dup-count dlq-count end-offsets demo-check

## examples: build outboxd and the demo programs (orderservice, statusconsumer, democtl) into bin/
examples:
	$(GO) build -o bin/ ./cmd/outboxd ./examples/orderservice ./examples/statusconsumer ./examples/democtl

## db-init: recreate the demo database, migrate (outboxd migrate, democtl migrate), create the publication and slot
## topic-create: recreate the demo topics and their .dlq topics, forget the consumer group
## run-service: create COUNT orders (default 100) through the outbox
## chaos-kill-publisher: run outboxd until it crashes after Kafka acked the first batch
## run-publisher / run-consumer: run outboxd / the status consumer in the foreground
## db-count, outbox-count, outbox-pending, dup-count, dlq-count, end-offsets: print one count
## demo-check: the demo's final assertions
db-init topic-create chaos-kill-publisher run-publisher run-consumer \
db-count outbox-count outbox-pending dup-count dlq-count end-offsets: examples
	@$(DEMO) $@

run-service: examples
	@COUNT=$(COUNT) $(DEMO) run-service

demo-check: examples
	@COUNT=$(COUNT) $(DEMO) check

## demo: the whole scenario on the dev stack, ending with the check (exit 1 if
## it fails). A stack the demo started is stopped again at the end (KEEP=1
## keeps it); one that was already up (make up) stays up.
demo: deps examples
	@set -euo pipefail; \
	if [ ! -f .devstack.env ] && [ -z "$(KEEP)" ]; then trap '$(STACK) down' EXIT; fi; \
	$(STACK) up; \
	COUNT=$(COUNT) $(DEMO) demo

## ---- The benchmark (bench/README.md): outboxd against Debezium and polling on the dev stack.
## Both start the stack if .devstack.env is missing, and then stop it again.
## bench/ is a Go module of its own: bin/bench is built from its folder.
.PHONY: bench bench-quick bench-sustained bench-chart
BENCH := bin/bench
BUILD_BENCH := $(GO) build -C bench -o $(CURDIR)/$(BENCH) .

## bench: the full matrix (~25 min): bench/results/{results.md,results.json,bench.png}
bench: deps
	@set -euo pipefail; \
	if [ ! -f .devstack.env ]; then trap '$(STACK) down' EXIT; fi; \
	$(STACK) up; \
	set -a; source ./.devstack.env; set +a; \
	$(GO) build -o bin/outboxd ./cmd/outboxd; \
	$(BUILD_BENCH); \
	$(BENCH) -outboxd bin/outboxd -out bench/results

## bench-memory: README's memory table: peak RSS of outboxd for
## events of 200 B to 900 KB, Kafka up and stopped 60 s, default and 16 MiB
## budgets (~15 min; needs the dev stack's .devstack.env):
## bench/results/memory.txt.
.PHONY: bench-memory
bench-memory: deps
	@set -euo pipefail; \
	set -a; source ./.devstack.env; set +a; \
	OUTBOXD_BENCH_MEMORY=1 $(GO) test -count=1 -timeout 60m -run 'TestMemoryTable|TestRunMemoryBoundedLargeTransactions' -v ./e2e/memory/ | tee bench/results/memory.txt

## bench-stranger: a role with no grants emits a logical decoding message
## of 1,000,000,000 bytes (PostgreSQL's largest value is 1 GB - 1) with
## outboxd's own prefix, and outbox_emit writes one of 200 MB, at the
## Kubernetes manifest's 32 MiB budget: peak RSS against its 256 MiB limit
## (~2 min; needs the dev stack's .devstack.env): bench/results/stranger.txt.
.PHONY: bench-stranger
bench-stranger: deps
	@set -euo pipefail; \
	set -a; source ./.devstack.env; set +a; \
	OUTBOXD_BENCH_STRANGER_BYTES=1000000000 OUTBOXD_BENCH_STRANGER_BUDGET=33554432 $(GO) test -count=1 -timeout 30m -run '^TestRunOwnPrefixMessageDoesNotSizeMemory$$' -v ./e2e/memory/ | tee bench/results/stranger.txt

## bench-audit: the wall time and peak RSS of outboxd audit (built without
## -race) over BENCH_AUDIT_EVENTS events (1,000,000 by default): rows
## inserted with generate_series, records produced by outboxd's producer
## through the replay path, 6 partitions (needs the dev stack's
## .devstack.env): bench/results/audit.txt
BENCH_AUDIT_EVENTS ?= 1000000
.PHONY: bench-audit
bench-audit:
	@set -euo pipefail; \
	set -a; source ./.devstack.env; set +a; \
	OUTBOXD_BENCH_AUDIT_EVENTS=$(BENCH_AUDIT_EVENTS) $(GO) test -count=1 -timeout 30m -run '^TestMeasureAudit$$' -v ./audit/ | tee bench/results/audit.txt

## bench-sustained: the highest rate the bare replication reader and then
## outboxd keep up with (p99 < 100 ms over 60 s windows) for 1-row and 100-row
## transactions, outboxd's as a fraction of the reader's, and the bottleneck
## there (~18 min): bin/bench-sustained/results.md
bench-sustained: deps
	@set -euo pipefail; \
	if [ ! -f .devstack.env ]; then trap '$(STACK) down' EXIT; fi; \
	$(STACK) up; \
	set -a; source ./.devstack.env; set +a; \
	$(GO) build -o bin/outboxd ./cmd/outboxd; \
	$(BUILD_BENCH); \
	$(BENCH) -outboxd bin/outboxd -only sustained -out bin/bench-sustained

## bench-network: the network matrix (~14 min on a quiet machine): the latency cells, a hot
## aggregate and the 1,000,000-row drain at RTT 0, 1 and 5 ms between the
## publishers and a broker of its own (bin/bench-network/kafka) that
## advertises a proxy (dev/stack proxy-start, internal/netproxy); PostgreSQL
## is the dev stack's. Writes bench/results/network.{md,json,png};
## BENCH_NETWORK_ARGS adds bench flags (e.g. -quick, -rtts 0,2ms, -out DIR).
.PHONY: bench-network
bench-network: deps
	@set -euo pipefail; \
	d=$(CURDIR)/bin/bench-network; \
	cleanup() { $(STACK) proxy-stop $$d/proxy || true; $(STACK) kafka-stop $$d/kafka || true; }; \
	if [ ! -f .devstack.env ]; then trap 'cleanup; $(STACK) down' EXIT; else trap cleanup EXIT; fi; \
	$(STACK) up; \
	set -a; source ./.devstack.env; set +a; \
	cleanup; rm -rf $$d; mkdir -p $$d; \
	kp=$$($(STACK) free-port); cp=$$($(STACK) free-port); pp=$$($(STACK) free-port); \
	$(STACK) kafka-init $$d/kafka $$kp $$cp --proxy $$pp; \
	$(STACK) kafka-start $$d/kafka; \
	$(STACK) proxy-start $$d/proxy kafka=$$pp=127.0.0.1:$$(cat $$d/kafka/proxied_port); \
	$(GO) build -o bin/outboxd ./cmd/outboxd; \
	$(BUILD_BENCH); \
	OUTBOXD_KAFKA_BROKERS=127.0.0.1:$$kp OUTBOXD_BENCH_KAFKA_DIR=$$d/kafka $(BENCH) -outboxd bin/outboxd -network \
		-proxy-api $$(cat $$d/proxy/api) -proxy-brokers 127.0.0.1:$$pp -out bench/results $(BENCH_NETWORK_ARGS)

## bench-quick: the reduced matrix (< 3 min), the smoke test make test runs
## (TestQuickBenchmark in go test -C bench); its report goes to bin/bench-quick/
bench-quick: deps
	@set -euo pipefail; \
	if [ ! -f .devstack.env ]; then trap '$(STACK) down' EXIT; fi; \
	$(STACK) with env CI=true BENCH_OUT=$(CURDIR)/bin/bench-quick $(GO) test -C bench -count=1 -timeout 10m -run '^TestQuickBenchmark$$' -v ./...

## bench-chart: draw a chart again from a report's JSON, without running the
## benchmark: CHART=bench/results/results.json (the default) redraws
## bench.png beside it, CHART=bench/results/network.json network.png
## (bin/bench -rewrite FILE writes the .md again too).
CHART ?= bench/results/results.json
bench-chart:
	$(BUILD_BENCH)
	$(BENCH) -chart $(CHART)
