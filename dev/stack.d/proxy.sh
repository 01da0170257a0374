# shellcheck shell=bash
# dev/stack's network proxy (internal/netproxy built into bin/netproxy).
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

proxy_pid() { [[ -f $1/pid ]] && cat "$1/pid"; }

# proxy-start DIR [--rtt D] NAME=LISTEN_PORT=UPSTREAM...: build bin/netproxy
# (internal/netproxy) and run it detached, its API on a free port (DIR/api).
proxy_start() {
	local usage='proxy-start DIR [--rtt DURATION] NAME=LISTEN_PORT=UPSTREAM_HOST:PORT...'
	local dir=${1:?$usage} rtt=0 api pid deadline r name rest
	local -a routes=()
	shift
	if [[ ${1:-} == --rtt ]]; then
		rtt=${2:?$usage}
		shift 2
	fi
	(($# > 0)) || die "usage: $usage"
	for r in "$@"; do
		name=${r%%=*} rest=${r#*=}
		[[ $name != "$r" && $rest == *=* ]] || die "proxy-start: $r: want NAME=LISTEN_PORT=UPSTREAM_HOST:PORT"
		routes+=("$name=127.0.0.1:${rest%%=*}=${rest#*=}")
	done
	command -v curl >/dev/null || apt_install curl
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [[ -n $(proxy_pid "$dir" || true) ]] && alive "$(proxy_pid "$dir")"; then
		die "a proxy already runs from $dir (pid $(proxy_pid "$dir"))"
	fi
	(cd "$ROOT" && go build -o bin/netproxy ./dev/netproxy) || die "go build ./dev/netproxy failed"
	api=$(free_port)
	rm -f "$dir/pid" "$dir/api"
	# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
	(
		cd "$dir" || exit # as dev/stack's set -e would; shellcheck sees this file alone
		setsid bash -c 'echo $$ >"$0"; exec "$@"' "$dir/pid" \
			"$ROOT/bin/netproxy" -api "127.0.0.1:$api" -rtt "$rtt" "${routes[@]}" \
			</dev/null >>"$dir/proxy.log" 2>&1 8>&- &
	)
	deadline=$((SECONDS + START_TIMEOUT))
	until curl -fsS --max-time 2 "http://127.0.0.1:$api/proxies" >/dev/null 2>&1; do
		pid=$(proxy_pid "$dir" || true)
		if [[ -n $pid ]] && ! alive "$pid"; then
			tail_log "$dir/proxy.log"
			die "the proxy in $dir exited during start"
		fi
		((SECONDS < deadline)) || { tail_log "$dir/proxy.log"; die "the proxy's API did not answer on port $api"; }
		sleep 0.1
	done
	echo "http://127.0.0.1:$api" >"$dir/api"
	log "proxy ready (API $(cat "$dir/api"), rtt $rtt): ${routes[*]}"
}

proxy_api() {
	[[ -f $1/api ]] || die "no proxy started in $1 (no $1/api)"
	cat "$1/api"
}

# proxy-set DIR NAME|all KEY=VALUE...
proxy_set() {
	local usage='proxy-set DIR NAME|all KEY=VALUE...' dir=${1:?proxy-set DIR NAME|all KEY=VALUE...} name=${2:?proxy-set DIR NAME|all KEY=VALUE...} q='' kv
	shift 2
	(($# > 0)) || die "usage: $usage"
	for kv in "$@"; do
		[[ $kv == *=* ]] || die "proxy-set: $kv: want KEY=VALUE (rtt, delay, jitter, bandwidth, blackhole)"
		q+="${q:+&}$kv"
	done
	curl -fsS --max-time 5 -X POST "$(proxy_api "$dir")/proxies/$name?$q" >/dev/null || die "proxy-set $name $*: refused"
	log "proxy $name: $*"
}

proxy_reset() {
	local dir=${1:?proxy-reset DIR NAME|all} name=${2:?proxy-reset DIR NAME|all}
	curl -fsS --max-time 5 -X POST "$(proxy_api "$dir")/proxies/$name/reset" >/dev/null || die "proxy-reset $name failed"
}

proxy_status() { curl -fsS --max-time 5 "$(proxy_api "${1:?proxy-status DIR}")/proxies"; }

proxy_stop() {
	local dir=${1:?proxy-stop DIR} pid
	pid=$(proxy_pid "$dir" || true)
	if [[ -n $pid ]] && alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		local deadline=$((SECONDS + STOP_TIMEOUT))
		while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
		alive "$pid" && kill -KILL "$pid" 2>/dev/null
		wait_gone "$pid" 10
	fi
	rm -f "$dir/pid" "$dir/api"
}
