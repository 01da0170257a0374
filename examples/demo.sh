#!/usr/bin/env bash
# examples/demo.sh — the outboxd demo, one step per subcommand; the Makefile's
# demo targets call it (make db-init, make run-service COUNT=100, ...), and
# `demo` runs them all and ends with the check. See README.md, "The demo".
#
# It uses the dev stack (.devstack.env, from `make up`) unless OUTBOXD_PG_DSN
# and OUTBOXD_KAFKA_BROKERS are set, a database of its own (DEMO_DB, default
# outboxd_demo, recreated by db-init), the slot and publication DEMO_SLOT /
# DEMO_PUBLICATION (outboxd_demo), the topics brew.orders.v1 and
# brew.order-status.v1 with their .dlq topics (recreated by topic-create), and
# the consumer group DEMO_GROUP (statusconsumer). Binaries come from bin/
# (`make examples`); logs of background processes go to .cache/demo/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="$ROOT/bin"
RUN_DIR="$ROOT/.cache/demo"

die() {
	echo "demo: error: $*" >&2
	exit 1
}

if [[ -z ${OUTBOXD_PG_DSN:-} || -z ${OUTBOXD_KAFKA_BROKERS:-} ]]; then
	[[ -f .devstack.env ]] || die "no .devstack.env: run 'make up' first (or set OUTBOXD_PG_DSN and OUTBOXD_KAFKA_BROKERS)"
	set -a
	# shellcheck source=/dev/null
	. ./.devstack.env
	set +a
fi
for b in outboxd orderservice statusconsumer democtl; do
	[[ -x $BIN/$b ]] || die "$BIN/$b is missing: run 'make examples'"
done

export DEMO_DB=${DEMO_DB:-outboxd_demo}
export DEMO_SLOT=${DEMO_SLOT:-outboxd_demo}
export DEMO_PUBLICATION=${DEMO_PUBLICATION:-outboxd_demo}
export DEMO_GROUP=${DEMO_GROUP:-statusconsumer}
DEMO_PG_DSN="$("$BIN/democtl" dsn "$DEMO_DB")"
export DEMO_PG_DSN
COUNT=${COUNT:-100}
[[ $COUNT =~ ^[0-9]+$ && $COUNT -ge 10 ]] || die "COUNT=$COUNT: the status changes need orders 1-10, so COUNT must be ≥ 10"
CRASH_AFTER=${CRASH_AFTER:-40} # the first batch: outboxd dies after Kafka acked this many events
ORDERS_TOPIC=brew.orders.v1
STATUS_TOPIC=brew.order-status.v1

# The post-publish hook (examples/internal/brew.SentHookSQL): once Kafka acked
# an order.created event, the order counts as sent to the establishment; the
# hook sets orders.status = 'sent_to_establishment' and emits the
# order.status_changed event, in one idempotent statement (it runs again when
# a crash makes outboxd publish the event again).
HOOK="$("$BIN/democtl" hook)"

# What the establishment reports after the orders went out: valid chains,
# and three invalid transitions (sent_to_establishment -> completed without
# accepted) each followed at once by valid ones for the same order, which
# must not be blocked by it.
TRANSITIONS=(
	"1=accepted" "1=completed" "2=accepted" "2=completed" "3=accepted" "3=completed"
	"4=accepted" "4=completed" "5=accepted" "5=completed"
	"6=completed" "6=accepted" "6=completed"
	"7=completed" "7=accepted" "7=completed"
	"8=completed" "8=accepted" "8=completed"
	"9=rejected" "10=cancelled"
)
INVALID=3

# The commands as arrays, not functions: started with &, a simple command is
# the process $! names, so stop_bg signals outboxd itself, not a subshell.
OUTBOXD_RUN=("$BIN/outboxd" run --pg-dsn "$DEMO_PG_DSN" --kafka-brokers "$OUTBOXD_KAFKA_BROKERS"
	--slot "$DEMO_SLOT" --publication "$DEMO_PUBLICATION" --hook "$HOOK")
CONSUMER_RUN=("$BIN/statusconsumer" --pg-dsn "$DEMO_PG_DSN" --kafka-brokers "$OUTBOXD_KAFKA_BROKERS"
	--group "$DEMO_GROUP" --topics "$ORDERS_TOPIC,$STATUS_TOPIC")

democtl() { "$BIN/democtl" "$@"; }

step() { printf '\n=== %s\n' "$*"; }

db_init() {
	democtl reset-db "$DEMO_DB"
	# outboxd's own table (outbox), then the examples' (orders, order_status)
	# and the consumer's dedup table (processed_outbox_ids).
	"$BIN/outboxd" migrate --pg-dsn "$DEMO_PG_DSN"
	democtl migrate
	# The slot must exist before the first order: rows committed before it are never captured.
	"$BIN/outboxd" slot create --pg-dsn "$DEMO_PG_DSN" --slot "$DEMO_SLOT" --publication "$DEMO_PUBLICATION"
}

topic_create() {
	democtl topics "$ORDERS_TOPIC:3" "$STATUS_TOPIC:3" "$ORDERS_TOPIC.dlq:1" "$STATUS_TOPIC.dlq:1"
	democtl delete-group
}

chaos_kill_publisher() {
	echo "outboxd run --crash-after-produce $CRASH_AFTER: exits (status 3) once Kafka acked $CRASH_AFTER events, before confirming them"
	local code=0
	"${OUTBOXD_RUN[@]}" --crash-after-produce "$CRASH_AFTER" --log-level warn || code=$?
	[[ $code == 3 ]] || die "outboxd exited $code, want 3 (the planned crash)"
	echo "outboxd crashed as planned (exit 3)"
}

# Background processes of `demo`, stopped on exit.
BG_PIDS=()
stop_bg() {
	local pid
	for pid in "${BG_PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	BG_PIDS=()
}

demo() {
	mkdir -p "$RUN_DIR"
	trap stop_bg EXIT

	step "1. db-init: database $DEMO_DB, migrations, publication and slot $DEMO_SLOT"
	db_init
	step "2. topic-create: $ORDERS_TOPIC and $STATUS_TOPIC (3 partitions), their .dlq topics; forget group $DEMO_GROUP"
	topic_create
	step "3. run-service: $COUNT orders, each in one transaction with its outbox row"
	"$BIN/orderservice" --pg-dsn "$DEMO_PG_DSN" --count "$COUNT"
	echo "orders=$(democtl count orders) outbox rows=$(democtl count outbox) outbox pending=$(democtl count pending)"

	step "4. chaos-kill-publisher: outboxd crashes after the first batch"
	chaos_kill_publisher
	echo "Kafka holds (end offsets):"
	democtl count end-offsets
	echo "outbox pending (nothing was confirmed): $(democtl count pending)"

	step "5. run-publisher: outboxd restarts from the confirmed position (background, log in $RUN_DIR/outboxd.log)"
	"${OUTBOXD_RUN[@]}" >"$RUN_DIR/outboxd.log" 2>&1 &
	BG_PIDS+=($!)
	democtl wait-published
	echo "Kafka holds (end offsets, re-sent events included):"
	democtl count end-offsets

	step "6. run-consumer: the status consumer projects every event once (background, output in $RUN_DIR/consumer.log)"
	"${CONSUMER_RUN[@]}" --log-level error >"$RUN_DIR/consumer.log" 2>&1 &
	local consumer=$!
	BG_PIDS+=("$consumer")
	democtl wait-consumed

	step "7. the establishment reports ${#TRANSITIONS[@]} status changes, $INVALID of them invalid"
	local args=()
	local t
	for t in "${TRANSITIONS[@]}"; do args+=(--set-status "$t"); done
	"$BIN/orderservice" --pg-dsn "$DEMO_PG_DSN" "${args[@]}"
	democtl wait-published
	democtl wait-consumed

	step "8. stop the consumer and outboxd"
	stop_bg
	echo "consumer output: $(grep -c '^INSERT' "$RUN_DIR/consumer.log") INSERT lines (all in $RUN_DIR/consumer.log), the first three:"
	grep '^INSERT' "$RUN_DIR/consumer.log" | head -n 3 || true
	echo "$(grep -c '^DUP' "$RUN_DIR/consumer.log") DUP lines, the first three:"
	grep '^DUP' "$RUN_DIR/consumer.log" | head -n 3 || true
	echo "the DLQ lines and the totals:"
	grep -E '^(DLQ|processed=)' "$RUN_DIR/consumer.log" || true

	step "9. check"
	democtl check --orders "$COUNT" --invalid "$INVALID"

	step "10. audit: every outbox row against what Kafka holds (the events the crash re-sent are duplicates, which at-least-once allows)"
	"$BIN/outboxd" audit --pg-dsn "$DEMO_PG_DSN" --kafka-brokers "$OUTBOXD_KAFKA_BROKERS" \
		--slot "$DEMO_SLOT" --publication "$DEMO_PUBLICATION" --from-id 1 --allow-duplicates
}

case ${1:-} in
db-init) db_init ;;
topic-create) topic_create ;;
run-service) "$BIN/orderservice" --pg-dsn "$DEMO_PG_DSN" --count "$COUNT" ;;
chaos-kill-publisher) chaos_kill_publisher ;;
run-publisher) exec "${OUTBOXD_RUN[@]}" ;;
run-consumer) exec "${CONSUMER_RUN[@]}" ;;
db-count) democtl count orders ;;
outbox-count) democtl count outbox ;;
outbox-pending) democtl count pending ;;
dup-count) democtl count dup ;;
dlq-count) democtl count dlq ;;
end-offsets) democtl count end-offsets ;;
check) democtl check --orders "$COUNT" --invalid "$INVALID" ;;
demo) demo ;;
*) die "usage: examples/demo.sh db-init|topic-create|run-service|chaos-kill-publisher|run-publisher|run-consumer|db-count|outbox-count|outbox-pending|dup-count|dlq-count|end-offsets|check|demo" ;;
esac
