# shellcheck shell=bash
# dev/stack's shared stack: up, down, status, deps, with.
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

# own_setting NAME: the value of NAME from the environment if the user set it
# for their own service, empty when unset or when it merely repeats what our
# own .devstack.env says (someone sourced it).
own_setting() {
	local name=$1 value=${!1:-} ours=''
	[[ -z $value ]] && return 0
	[[ -f $ENV_FILE ]] && ours=$(sed -n "s/^$name=//p" "$ENV_FILE")
	if [[ $value == "$ours" && -d $STACK_DIR ]]; then
		return 0
	fi
	[[ $value =~ [[:space:]\"\'] ]] && die "$name must be one word (use the URL form), got: $value"
	echo "$value"
}

# shared_pg_dir: .devstack/pg, unless the postgres user cannot reach it (a
# private parent folder while we are root); then a folder under /tmp that
# .devstack/pg.path remembers.
shared_pg_dir() {
	if [[ -f $STACK_DIR/pg.path ]]; then
		cat "$STACK_DIR/pg.path"
	elif ! is_root || runuser -u postgres -- test -x "$STACK_DIR"; then
		echo "$STACK_DIR/pg"
	else
		mktemp -d /tmp/outboxd-devstack-pg.XXXXXX | tee "$STACK_DIR/pg.path"
	fi
}

# lock_stack: serialise up/down of the shared stack (two terminals, or two
# `make test` runs in one tree); the lock lives outside .devstack/, which down
# removes. The servers we start must not inherit fd 8, or they would hold the
# lock for their whole life.
lock_stack() {
	mkdir -p "$ROOT/.cache"
	exec 8>"$ROOT/.cache/devstack.lock"
	flock -w 300 8 || die "another dev/stack up/down still holds .cache/devstack.lock"
}

cmd_up() {
	local pg_dsn kafka_brokers dir port cport bin nodes have want
	lock_stack
	mkdir -p "$STACK_DIR"
	chmod 755 "$STACK_DIR"

	pg_dsn=$(own_setting OUTBOXD_PG_DSN)
	if [[ -n $pg_dsn ]]; then
		log "OUTBOXD_PG_DSN is set: using that PostgreSQL, starting none"
	else
		dir=$(shared_pg_dir)
		want=$(pg_dist_version "${OUTBOXD_PG_VERSION:-}")
		if [[ -n ${OUTBOXD_PG_VERSION:-} && -f $dir/port && $want != "$(pg_instance_version "$dir")" ]]; then
			die "the stack runs PostgreSQL $(pg_instance_version "$dir" | grep . || echo "from Debian"); run dev/stack down first for OUTBOXD_PG_VERSION=$OUTBOXD_PG_VERSION"
		fi
		[[ -f $dir/port ]] || { rm -rf "$dir/data" && pg_init "$dir" "$(free_port)" --version "${OUTBOXD_PG_VERSION:-}"; }
		pg_start "$dir"
		port=$(<"$dir/port")
		bin=$(pg_bindir)
		if [[ -z $("$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -XAtqc \
			"SELECT 1 FROM pg_database WHERE datname = 'outboxd'") ]]; then
			"$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -Xqc 'CREATE DATABASE outboxd' >/dev/null
		fi
		pg_dsn="postgres://postgres@127.0.0.1:$port/outboxd?sslmode=disable"
	fi

	kafka_brokers=$(own_setting OUTBOXD_KAFKA_BROKERS)
	if [[ -n $kafka_brokers ]]; then
		log "OUTBOXD_KAFKA_BROKERS is set: using that Kafka, starting none"
	else
		nodes=${OUTBOXD_KAFKA_NODES:-}
		if [[ -z $nodes ]]; then # keep what the stack has; a new stack gets one broker
			nodes=1
			[[ -f $STACK_DIR/kafka1/port ]] && nodes=$(kafka_nodes "$STACK_DIR" | grep -c .)
		fi
		[[ $nodes =~ ^[1-9]$ ]] || die "OUTBOXD_KAFKA_NODES must be 1 to 9, not $nodes"
		if ((nodes == 1)); then
			[[ -f $STACK_DIR/kafka1/port ]] &&
				die "the stack runs a Kafka cluster in .devstack/kafka1..; run dev/stack down first for one broker"
			dir="$STACK_DIR/kafka"
			if [[ ! -f $dir/port ]]; then
				port=$(free_port)
				cport=$(free_port)
				while [[ $cport == "$port" ]]; do cport=$(free_port); done
				rm -rf "$dir"
				kafka_init "$dir" "$port" "$cport"
			fi
			kafka_start "$dir"
			kafka_brokers="127.0.0.1:$(<"$dir/port")"
		else
			[[ -f $STACK_DIR/kafka/port ]] &&
				die "the stack runs one broker in .devstack/kafka; run dev/stack down first for OUTBOXD_KAFKA_NODES=$nodes"
			if [[ ! -f $STACK_DIR/kafka1/port ]]; then
				rm -rf "$STACK_DIR"/kafka[0-9]*
				kafka_cluster_init "$STACK_DIR" "$nodes"
			fi
			have=$(kafka_nodes "$STACK_DIR" | grep -c .)
			((have == nodes)) ||
				die "the stack runs a Kafka cluster of $have nodes; run dev/stack down first for OUTBOXD_KAFKA_NODES=$nodes"
			kafka_cluster_start "$STACK_DIR"
			kafka_brokers=''
			while IFS= read -r dir; do
				kafka_brokers+="${kafka_brokers:+,}127.0.0.1:$(<"$dir/port")"
			done < <(kafka_nodes "$STACK_DIR")
		fi
	fi

	# Plain KEY=value lines: read by `source`, make's include and internal/testenv.
	printf 'OUTBOXD_PG_DSN=%s\nOUTBOXD_KAFKA_BROKERS=%s\n' "$pg_dsn" "$kafka_brokers" >"$ENV_FILE.tmp"
	mv "$ENV_FILE.tmp" "$ENV_FILE"
	log "wrote ${ENV_FILE#"$ROOT"/}:"
	sed 's/^/    /' "$ENV_FILE" >&2
}

cmd_down() {
	local pg_dir=''
	lock_stack
	[[ -f $STACK_DIR/pg.path ]] && pg_dir=$(<"$STACK_DIR/pg.path")
	[[ -d $STACK_DIR/pg ]] && pg_dir="$STACK_DIR/pg"
	if [[ -n $pg_dir && -d $pg_dir ]]; then
		pg_stop "$pg_dir" fast
		rm -rf "$pg_dir"
	fi
	[[ -d $STACK_DIR/kafka ]] && kafka_stop "$STACK_DIR/kafka"
	[[ -d $STACK_DIR ]] && kafka_cluster_stop "$STACK_DIR"
	rm -rf "$STACK_DIR" "$ENV_FILE"
	log "stack down"
}

cmd_status() {
	local pg_dir="$STACK_DIR/pg" dir
	[[ -f $STACK_DIR/pg.path ]] && pg_dir=$(<"$STACK_DIR/pg.path")
	if [[ -f $pg_dir/port ]] && pg_running "$pg_dir"; then
		echo "postgres: running on 127.0.0.1:$(<"$pg_dir/port") ($pg_dir, $("$(pg_bin_of "$pg_dir")/postgres" --version))"
	else
		echo "postgres: not running"
	fi
	if [[ -f $STACK_DIR/kafka1/port ]]; then
		while IFS= read -r dir; do
			if kafka_running "$dir"; then
				echo "${dir##*/}:   running on 127.0.0.1:$(<"$dir/port") (pid $(kafka_pid "$dir"))"
			else
				echo "${dir##*/}:   not running"
			fi
		done < <(kafka_nodes "$STACK_DIR")
	elif kafka_running "$STACK_DIR/kafka"; then
		echo "kafka:    running on 127.0.0.1:$(<"$STACK_DIR/kafka/port") (pid $(kafka_pid "$STACK_DIR/kafka"))"
	else
		echo "kafka:    not running"
	fi
	[[ -f $ENV_FILE ]] && cat "$ENV_FILE"
	return 0
}

# cmd_with CMD [ARG...]: up, then CMD with .devstack.env's variables in its
# environment, in place of this process (its exit status is ours). For
# recipes that would otherwise source .devstack.env by hand after up.
cmd_with() {
	(($# > 0)) || die "usage: with CMD [ARG...]"
	cmd_up
	exec 8>&- # CMD may run for long: it must not hold the stack lock (lock_stack)
	set -a
	# shellcheck source=/dev/null # written by cmd_up
	source "$ENV_FILE"
	set +a
	exec "$@"
}

cmd_deps() {
	cmd_lint_deps
	ensure_postgres
	ensure_java
	ensure_kafka_libs
	ensure_registry # the Schema Registry the format tests start
	local v
	v=$(pg_dist_version "${OUTBOXD_PG_VERSION:-}")
	if [[ -n $v ]]; then ensure_pg_dist "$v"; fi
	log "deps ok: $("$(pg_bindir)/postgres" --version)${v:+ and $v}, Kafka $KAFKA_VERSION, $(java -version 2>&1 | head -n 1)"
}
