# shellcheck shell=bash
# dev/stack's Schema Registry (Apicurio, Confluent-compatible API).
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

# Apicurio Registry serves the Confluent Schema Registry API under
# /apis/ccompat/v7. Maven Central as reached here has no runnable 3.x (missing
# modules) and 2.6's app components are not served either; 2.4.2.Final is
# built from its app jar with the Quarkus plugin (dev/registry/pom.xml says
# what is swapped and why) into one runner jar, storage in memory (H2).
REGISTRY_CACHE="$ROOT/.cache/registry-$REGISTRY_VERSION"

ensure_registry() {
	[[ -f $REGISTRY_CACHE/complete ]] && return 0
	command -v mvn >/dev/null || apt_install maven
	mkdir -p "$REGISTRY_CACHE"
	(
		flock 9
		[[ -f $REGISTRY_CACHE/complete ]] && exit 0
		log "building Apicurio Registry $REGISTRY_VERSION with Maven (once, a few minutes)"
		rm -rf "$REGISTRY_CACHE/build" && mkdir -p "$REGISTRY_CACHE/build"
		cp -r "$ROOT/dev/registry/pom.xml" "$ROOT/dev/registry/src" "$REGISTRY_CACHE/build/"
		# The app's own settings, from its jar, plus the index of the app jar
		# (a dependency here, and it carries no Jandex index).
		mvn -B -q -s "$ROOT/dev/registry/settings.xml" dependency:get \
			-Dtransitive=false -Dartifact="io.apicurio:apicurio-registry-app:$REGISTRY_VERSION" >"$REGISTRY_CACHE/mvn.log" 2>&1 ||
			{ tail_log "$REGISTRY_CACHE/mvn.log"; die "could not fetch apicurio-registry-app $REGISTRY_VERSION"; }
		mkdir -p "$REGISTRY_CACHE/build/src/main/resources"
		{
			unzip -p "$HOME/.m2/repository/io/apicurio/apicurio-registry-app/$REGISTRY_VERSION/apicurio-registry-app-$REGISTRY_VERSION.jar" application.properties
			echo
			echo "quarkus.index-dependency.apicurio-app.group-id=io.apicurio"
			echo "quarkus.index-dependency.apicurio-app.artifact-id=apicurio-registry-app"
		} >"$REGISTRY_CACHE/build/src/main/resources/application.properties"
		(cd "$REGISTRY_CACHE/build" && mvn -B -s "$ROOT/dev/registry/settings.xml" package -DskipTests) >>"$REGISTRY_CACHE/mvn.log" 2>&1 ||
			{ tail_log "$REGISTRY_CACHE/mvn.log"; die "could not build Apicurio Registry (log: $REGISTRY_CACHE/mvn.log)"; }
		touch "$REGISTRY_CACHE/complete"
	) 9>"$REGISTRY_CACHE.lock"
}

registry_pid() { [[ -f $1/pid ]] && cat "$1/pid"; }

# registry-start DIR [PORT]: start the registry on 127.0.0.1:PORT (a free
# port by default), wait until /health/ready answers, write DIR/url.
registry_start() {
	local dir=${1:?registry-start DIR [PORT]} port=${2:-} pid deadline
	command -v curl >/dev/null || apt_install curl
	ensure_registry
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	[[ -n $port ]] || port=$(free_port)
	# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
	(
		cd "$dir" || exit # as dev/stack's set -e would; shellcheck sees this file alone
		setsid bash -c 'echo $$ >"$0"; exec "$@"' "$dir/pid" \
			java -Xmx192m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
			-Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
			-jar "$REGISTRY_CACHE/build/target/registry-1.0-runner.jar" \
			</dev/null >>"$dir/registry.log" 2>&1 8>&- &
	)
	deadline=$((SECONDS + ${OUTBOXD_STACK_START_TIMEOUT:-120}))
	until curl -fsS --max-time 2 "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1; do
		pid=$(registry_pid "$dir" || true)
		if [[ -n $pid ]] && ! alive "$pid"; then
			tail_log "$dir/registry.log"
			die "the registry in $dir exited during start (log: $dir/registry.log)"
		fi
		((SECONDS < deadline)) || { tail_log "$dir/registry.log"; die "the registry did not become ready on port $port"; }
		sleep 0.2
	done
	echo "http://127.0.0.1:$port/apis/ccompat/v7" >"$dir/url"
	log "Schema Registry (Apicurio $REGISTRY_VERSION, Confluent API) ready at $(cat "$dir/url")"
}

registry_stop() {
	local dir=${1:?registry-stop DIR} pid
	pid=$(registry_pid "$dir" || true)
	if [[ -n $pid ]] && alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		local deadline=$((SECONDS + STOP_TIMEOUT))
		while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
		alive "$pid" && kill -KILL "$pid" 2>/dev/null
		wait_gone "$pid" 10
	fi
	rm -f "$dir/pid"
}
