# shellcheck shell=bash
# dev/stack's Debezium worker, to benchmark outboxd against.
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

# Debezium (benchmarks only): a Kafka Connect standalone worker of the same
# Kafka with Debezium's PostgreSQL connector, jars from Maven Central too.
DEBEZIUM_POM="$ROOT/dev/debezium/pom.xml"
DEBEZIUM_CACHE="$ROOT/.cache/debezium-${DEBEZIUM_VERSION%.Final}"
DEBEZIUM_LIBS="$DEBEZIUM_CACHE/libs"

# A Kafka Connect standalone worker running Debezium's PostgreSQL connector,
# for benchmarks against outboxd (not used by the tests or CI). Its jars come
# from Maven Central like Kafka's (dev/debezium/pom.xml); the worker, the
# connector and the Outbox Event Router share one classpath.

# ensure_debezium_libs: fetch the worker's jars once into
# .cache/debezium-VERSION/libs (a lock, a marker once complete).
ensure_debezium_libs() { fetch_jars "$DEBEZIUM_POM" "$DEBEZIUM_CACHE" "Kafka Connect $KAFKA_VERSION and Debezium $DEBEZIUM_VERSION"; }

cmd_debezium_deps() {
	ensure_debezium_libs
	log "deps ok: Kafka Connect $KAFKA_VERSION and Debezium $DEBEZIUM_VERSION in ${DEBEZIUM_LIBS#"$ROOT"/}"
}

# stack_setting NAME: NAME from the environment, else from .devstack.env.
stack_setting() {
	local name=$1
	if [[ -n ${!name:-} ]]; then
		echo "${!name}"
	elif [[ -f $ENV_FILE ]]; then
		sed -n "s/^$name=//p" "$ENV_FILE"
	fi
}

debezium_pid() { [[ -f $1/pid ]] && cat "$1/pid"; }

debezium_running() {
	local pid
	pid=$(debezium_pid "$1") || return 1
	alive "$pid" && grep -qa 'ConnectStandalone' "/proc/$pid/cmdline" 2>/dev/null
}

# set_property FILE KEY=VALUE: set KEY in a properties file (drop its line,
# append the new one).
set_property() {
	local file=$1 key=${2%%=*} value=${2#*=} line
	local -a lines=()
	[[ $2 == *=* && -n $key ]] || die "a worker setting must be KEY=VALUE, not: $2"
	mapfile -t lines <"$file"
	for line in "${lines[@]}"; do
		[[ ${line%%=*} == "$key" ]] || printf '%s\n' "$line"
	done >"$file.tmp"
	printf '%s=%s\n' "$key" "$value" >>"$file.tmp"
	mv "$file.tmp" "$file"
}

# fill_connector TEMPLATE OUT: copy a connector config, replacing the @NAME@
# placeholders of dev/debezium/outbox.properties.tmpl (PostgreSQL from
# OUTBOXD_PG_DSN or .devstack.env, the rest from OUTBOXD_DEBEZIUM_*); a file
# without placeholders is copied as is.
fill_connector() {
	local tmpl=$1 out=$2 dsn line key left
	local re='^postgres(ql)?://([^:@/]+)(:([^@]*))?@([^:/?]+)(:([0-9]+))?/([^?]+)(\?.*)?$'
	local -A vals=()
	if grep -v '^#' "$tmpl" | grep -q '@PG[A-Z]*@'; then
		dsn=$(stack_setting OUTBOXD_PG_DSN)
		[[ -n $dsn ]] || die "OUTBOXD_PG_DSN is not set and there is no .devstack.env (run dev/stack up)"
		[[ $dsn =~ $re ]] || die "OUTBOXD_PG_DSN must look like postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?...], not: $dsn"
		vals=([PGUSER]=${BASH_REMATCH[2]} [PGPASSWORD]=${BASH_REMATCH[4]} [PGHOST]=${BASH_REMATCH[5]}
			[PGPORT]=${BASH_REMATCH[7]:-5432} [PGDB]=${BASH_REMATCH[8]})
	fi
	vals[SLOT]=${OUTBOXD_DEBEZIUM_SLOT:-debezium_bench}
	vals[PUBLICATION]=${OUTBOXD_DEBEZIUM_PUBLICATION:-debezium_bench}
	vals[TABLE]=${OUTBOXD_DEBEZIUM_TABLE:-public.outbox}
	vals[POLL_MS]=${OUTBOXD_DEBEZIUM_POLL_MS:-500}
	while IFS= read -r line || [[ -n $line ]]; do
		if [[ $line != \#* ]]; then
			for key in "${!vals[@]}"; do
				line=${line//"@$key@"/"${vals[$key]}"}
			done
		fi
		printf '%s\n' "$line"
	done <"$tmpl" >"$out"
	left=$(grep -v '^#' "$out" | grep -o '@[A-Z_]*@' | sort -u | paste -sd ' ' || true)
	[[ -z $left ]] || die "$tmpl: unknown placeholders $left"
}

# debezium_errors DIR: after a failed start, the worker's ERROR and WARN
# lines with the line after each (the log's tail is often just the shutdown).
debezium_errors() {
	[[ -f $1/connect.log ]] || return 0
	log "errors and warnings in $1/connect.log:"
	grep -A1 -E '^\[[^]]*\] (ERROR|WARN)' "$1/connect.log" | grep -v '^--$' | tail -n 20 | cut -c1-400 | sed 's/^/    /' >&2
}

# debezium_status URL NAME: the connector's status JSON from the REST API.
debezium_status() { curl -fsS --max-time 2 "$1/connectors/$2/status" 2>/dev/null; }

debezium_start() {
	local usage='debezium-start DIR CONNECTOR_PROPERTIES [KEY=VALUE...]'
	local dir=${1:?$usage} conn=${2:?$usage} name brokers port url pid='' status t0 deadline timeout kv
	shift 2
	[[ -f $conn ]] || die "no connector config $conn; usage: $usage"
	command -v curl >/dev/null || apt_install curl
	ensure_debezium_libs
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if debezium_running "$dir"; then
		die "Debezium in $dir already runs (pid $(debezium_pid "$dir")); debezium-stop it first"
	fi
	fill_connector "$conn" "$dir/connector.properties"
	name=$(sed -n 's/^name[[:space:]]*=[[:space:]]*//p' "$dir/connector.properties" | tail -n 1)
	[[ -n $name ]] || die "$conn has no name= line"

	port=$(free_port)
	brokers=$(stack_setting OUTBOXD_KAFKA_BROKERS)
	{
		echo "# Kafka Connect standalone worker for Debezium (dev/stack debezium-start)"
		echo "bootstrap.servers=$brokers"
		echo "key.converter=org.apache.kafka.connect.storage.StringConverter"
		echo "value.converter=org.apache.kafka.connect.storage.StringConverter"
		echo "header.converter=org.apache.kafka.connect.storage.SimpleHeaderConverter"
		echo "offset.storage.file.filename=$dir/offsets"
		echo "offset.flush.interval.ms=1000"
		echo "listeners=http://127.0.0.1:$port"
		echo "rest.advertised.host.name=127.0.0.1"
		echo "rest.advertised.port=$port"
		echo "plugin.discovery=service_load"
		echo "connector.client.config.override.policy=All"
		echo "producer.linger.ms=0"
	} >"$dir/worker.properties"
	for kv in "$@"; do set_property "$dir/worker.properties" "$kv"; done
	grep -q '^bootstrap.servers=.' "$dir/worker.properties" ||
		die "no Kafka: set OUTBOXD_KAFKA_BROKERS, run dev/stack up, or pass bootstrap.servers=HOST:PORT"
	port=$(sed -n 's|^listeners=.*:\([0-9][0-9]*\)$|\1|p' "$dir/worker.properties" | tail -n 1)
	[[ -n $port ]] || die "listeners in $dir/worker.properties must end in :PORT"
	url="http://127.0.0.1:$port"
	echo "$url" >"$dir/rest_url"

	rm -f "$dir/pid"
	[[ -f $dir/connect.log ]] && mv "$dir/connect.log" "$dir/connect.log.prev"
	t0=$(date +%s%N)
	# As kafka-start: detached, no inherited stdio, the pid file names java.
	# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
	(
		cd "$dir" || exit # as dev/stack's set -e would; shellcheck sees this file alone
		setsid bash -c 'echo $$ >"$0"; exec "$@"' "$dir/pid" \
			java "-Xmx${OUTBOXD_DEBEZIUM_HEAP:-1g}" -Xms256m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
			-Djava.awt.headless=true -Dkafka.logs.dir="$dir" -Dkafka.log.file=connect.log \
			-Dlog4j2.configurationFile="$KAFKA_LOG4J" -cp "$DEBEZIUM_LIBS/*" \
			org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" "$dir/connector.properties" \
			</dev/null >>"$dir/stdout.log" 2>&1 8>&- &
	)

	# Ready = the REST API reports the connector's task 0 RUNNING (slot and
	# publication exist) AND the task logged that it streams from the slot
	# ("Processing messages"): RUNNING alone comes before the replication
	# stream, which Debezium retries for a minute if the slot is busy.
	timeout=${OUTBOXD_DEBEZIUM_START_TIMEOUT:-120}
	deadline=$((SECONDS + timeout))
	while :; do
		pid=$(debezium_pid "$dir" || true)
		if [[ -n $pid ]] && ! alive "$pid"; then
			rm -f "$dir/pid"
			if [[ -s $dir/stdout.log ]]; then tail_log "$dir/stdout.log"; fi
			debezium_errors "$dir"
			die "Debezium in $dir exited during start (log: $dir/connect.log)"
		fi
		status=$(debezium_status "$url" "$name" || true)
		if [[ $status == *'"tasks":[{"id":0,"state":"RUNNING"'* ]] &&
			grep -q 'INFO Processing messages' "$dir/connect.log" 2>/dev/null; then
			break
		fi
		if [[ $status == *'"state":"FAILED"'* ]]; then
			log "connector status: $status"
			debezium_errors "$dir"
			debezium_stop "$dir" || true
			die "Debezium connector $name in $dir failed"
		fi
		if ((SECONDS >= deadline)); then
			debezium_errors "$dir"
			debezium_stop "$dir" || true
			die "Debezium connector $name in $dir not RUNNING and streaming within ${timeout}s"
		fi
		sleep 0.1
	done
	log "Debezium connector $name RUNNING and streaming after $((($(date +%s%N) - t0) / 1000000)) ms (pid $pid, REST $url, log $dir/connect.log)"
	printf 'DEBEZIUM_PID=%s\nDEBEZIUM_REST_URL=%s\n' "$pid" "$url"
}

debezium_stop() {
	local dir=${1:?debezium-stop DIR} pid deadline
	if ! debezium_running "$dir"; then
		rm -f "$dir/pid"
		return 0
	fi
	pid=$(debezium_pid "$dir")
	# SIGTERM: the worker stops the task and flushes its offsets one last
	# time, which is when Debezium confirms the last LSN to its slot.
	kill -TERM "$pid" 2>/dev/null || true
	kill -CONT "$pid" 2>/dev/null || true
	deadline=$((SECONDS + STOP_TIMEOUT))
	while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
	if alive "$pid"; then
		log "Debezium $pid did not stop within ${STOP_TIMEOUT}s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait_gone "$pid" 10
	rm -f "$dir/pid"
	log "Debezium in $dir stopped"
}
