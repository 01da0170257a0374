# shellcheck shell=bash
# dev/stack's Kafka: KRaft nodes from Maven Central jars, single or a cluster.
# Sourced by dev/stack after dev/versions, beside the other parts: it uses
# ROOT, STACK_DIR, ENV_FILE, the timeouts and the helpers set there (log, die,
# alive, free_port, ...) and only defines functions and their variables, so
# the parts may be sourced in any order.

KAFKA_POM="$ROOT/dev/kafka/pom.xml"
KAFKA_LOG4J="$ROOT/dev/kafka/log4j2.properties"
KAFKA_CACHE="$ROOT/.cache/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_CACHE/libs"

# ensure_kafka_libs: fetch the broker's jars from Maven Central once into
# .cache/kafka-VERSION/libs. A lock keeps parallel callers (tests) from
# fetching twice; the folder appears only when complete.
ensure_kafka_libs() { fetch_jars "$KAFKA_POM" "$KAFKA_CACHE" "Kafka $KAFKA_VERSION"; }

# kafka_java DIR LOGFILE: set JAVA_CMD to the java command line that runs a
# Kafka main class with our classpath, logging to DIR/LOGFILE. The heap
# (512 MiB max per broker) lets three brokers share a small machine. With
# the class-data-sharing archive (ensure_kafka_cds) a JVM maps the classes
# a broker loads instead of loading and verifying them: a start takes about
# half the time and CPU (10 s → 5.6 s, 5.2 → 3.1 CPU-seconds, measured on 2
# cores), and the tests start and restart private brokers dozens of times.
#
# A broker outside .devstack/ is a test's (testenv starts them in /tmp and
# throws them away within minutes): it compiles with C1 only
# (-XX:TieredStopAtLevel=1), which skips the optimising compiler's CPU. Measured
# on 2 cores: a start takes 2.5 CPU-seconds instead of 3.3-4.2, and 200,000
# idempotent acks=all records 1.2-1.6 CPU-seconds of the broker's instead of
# 2.0-2.4. The dev stack's broker lives long and carries the benchmarks: it
# keeps the optimising compiler.
kafka_java() {
	local -a cds=() jit=()
	if [[ -n ${KAFKA_CDS_DUMP:-} ]]; then
		cds=(-XX:ArchiveClassesAtExit="$KAFKA_CDS_DUMP")
	elif [[ -n ${KAFKA_CDS:-} && -f $KAFKA_CDS ]]; then
		cds=(-XX:SharedArchiveFile="$KAFKA_CDS")
	fi
	[[ $1 == "$STACK_DIR"/* ]] || jit=(-XX:TieredStopAtLevel=1)
	JAVA_CMD=(java -Xmx512m -Xms256m -Djava.awt.headless=true "${cds[@]}" "${jit[@]}"
		-Dkafka.logs.dir="$1" -Dkafka.log.file="$2"
		-Dlog4j2.configurationFile="$KAFKA_LOG4J"
		-cp "$KAFKA_LIBS/*")
}

# ensure_kafka_cds: set KAFKA_CDS to a class-data-sharing archive of the
# classes a broker loads while it starts, made once (under a lock) by
# starting and cleanly stopping a throwaway broker with
# -XX:ArchiveClassesAtExit (JDK 17 cannot make one on the fly). An archive
# is valid only for the JVM build and the class path it was made with, so
# both name it. A failure to make one is logged and remembered: brokers then
# start as before, only slower.
ensure_kafka_cds() {
	local key
	[[ -n ${KAFKA_CDS_MAKING:-} ]] && return 0 # we are making it
	key=$( (java -version 2>&1; printf '%s\n' "$KAFKA_LIBS") | cksum | cut -d' ' -f1)
	KAFKA_CDS="$KAFKA_CACHE/broker-$key.jsa"
	[[ -f $KAFKA_CDS || -f $KAFKA_CDS.failed ]] && return 0
	(
		flock 9
		[[ -f $KAFKA_CDS || -f $KAFKA_CDS.failed ]] && exit 0
		log "making the Kafka class-data-sharing archive $KAFKA_CDS (once)"
		tmp=$(mktemp -d /tmp/outboxd-kafka-cds-XXXXXX)
		trap 'kafka_stop "$tmp/kafka" kill >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
		export KAFKA_CDS_MAKING=1
		# In a subshell of its own: a step that dies ends only it.
		if (
			p1=$(free_port)
			p2=$(free_port)
			while [[ $p2 == "$p1" ]]; do p2=$(free_port); done
			# (set -e does not apply inside an if's condition: hence &&.)
			kafka_init "$tmp/kafka" "$p1" "$p2" &&
				KAFKA_CDS_DUMP="$tmp/broker.jsa" kafka_start "$tmp/kafka" &&
				kafka_stop "$tmp/kafka" &&
				[[ -s $tmp/broker.jsa ]] &&
				java -Xshare:on -XX:SharedArchiveFile="$tmp/broker.jsa" -cp "$KAFKA_LIBS/*" -version
		) 9>&- >"$tmp/make.log" 2>&1; then
			cp "$tmp/broker.jsa" "$KAFKA_CDS.tmp" && mv "$KAFKA_CDS.tmp" "$KAFKA_CDS"
			log "Kafka class-data-sharing archive made"
		else
			tail_log "$tmp/make.log"
			log "could not make the Kafka class-data-sharing archive: brokers start without it (delete $KAFKA_CDS.failed to try again)"
			cp "$tmp/make.log" "$KAFKA_CDS.failed"
		fi
	) 9>"$KAFKA_CACHE/cds.lock" || log "making the Kafka class-data-sharing archive failed: brokers start without it"
}

kafka_pid() { [[ -f $1/pid ]] && cat "$1/pid"; }

kafka_running() {
	local pid
	pid=$(kafka_pid "$1") || return 1
	alive "$pid" && grep -qa 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null
}

kafka_init() {
	local usage='kafka-init DIR PORT CONTROLLER_PORT [--sasl SASL_PORT [--tls TLS_PORT]] [--node-id ID --voters VOTERS --cluster-id ID] [--proxy PROXY_PORT]'
	local dir=${1:?$usage} port=${2:?$usage} cport=${3:?$usage} cluster_id='' sport='' tport='' sasl_user=outboxd sasl_pw=''
	local pport='' inner=''
	local node_id=1 voters='' nvoters rf min_isr
	local -a scram_args=()
	shift 3
	while (($# > 0)); do
		case $1 in
		--sasl) sport=${2:?$usage} ;;
		--tls) tport=${2:?$usage} ;;
		--node-id) node_id=${2:?$usage} ;;
		--voters) voters=${2:?$usage} ;;
		--cluster-id) cluster_id=${2:?$usage} ;;
		--proxy) pport=${2:?$usage} ;;
		*) die "usage: $usage" ;;
		esac
		shift 2
	done
	[[ -n $tport && -z $sport ]] && die "--tls needs --sasl; usage: $usage"
	[[ $node_id =~ ^[0-9]+$ ]] || die "--node-id must be a number, not $node_id"
	voters=${voters:-$node_id@127.0.0.1:$cport}
	# Replication follows the quorum's size: 3 nodes give RF 3 and min ISR 2,
	# so one node may be down without stopping acks=all producers.
	nvoters=$(tr ',' '\n' <<<"$voters" | grep -c .)
	rf=$((nvoters < 3 ? nvoters : 3))
	min_isr=$((rf > 1 ? rf - 1 : 1))
	ensure_kafka_libs
	[[ -e $dir/data ]] && die "$dir/data already exists"
	mkdir -p "$dir/data"
	dir=$(cd "$dir" && pwd)

	cat >"$dir/server.properties" <<EOF
# outboxd dev stack: one KRaft node that is broker and controller (dev/stack kafka-init)
process.roles=broker,controller
node.id=$node_id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
# A killed node may register again only once the controller has dropped its
# old session: 4 s instead of 9 s, with heartbeats often enough to keep a
# live node's session on a busy machine.
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=500
EOF
	if ((nvoters > 1)); then
		# Lean for a small machine: fewer threads and internal partitions
		# (each one has rf replicas) than Kafka's defaults.
		cat >>"$dir/server.properties" <<EOF
num.network.threads=2
num.io.threads=4
background.threads=4
offsets.topic.num.partitions=10
transaction.state.log.num.partitions=10
EOF
	fi
	if [[ -n $sport ]]; then
		# A SASL_PLAINTEXT listener beside PLAINTEXT (which stays for admin
		# tools and inter-broker traffic). The SCRAM credentials are written
		# into the metadata log at format time (--add-scram), PLAIN's into the
		# listener's JAAS line.
		sasl_pw=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
		sed -i -e "s|^listeners=.*|&,SASL_PLAINTEXT://127.0.0.1:$sport|" \
			-e "s|^advertised.listeners=.*|&,SASL_PLAINTEXT://127.0.0.1:$sport|" \
			-e "s|^listener.security.protocol.map=.*|&,SASL_PLAINTEXT:SASL_PLAINTEXT|" "$dir/server.properties"
		cat >>"$dir/server.properties" <<EOF
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$sasl_user="$sasl_pw";
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
		chmod 600 "$dir/server.properties"
		scram_args=(--add-scram "SCRAM-SHA-256=[name=$sasl_user,password=$sasl_pw]"
			--add-scram "SCRAM-SHA-512=[name=$sasl_user,password=$sasl_pw]")
		(umask 077 && printf '%s\n' "$sasl_pw" >"$dir/sasl.password")
		echo "$sasl_user" >"$dir/sasl.user"
		echo "$sport" >"$dir/sasl_port"
	fi
	if [[ -n $tport ]]; then
		kafka_tls "$dir" "$tport" "$sasl_user" "$sasl_pw"
	fi
	if [[ -n $pport ]]; then
		# A listener the broker advertises at the proxy's port: clients that
		# bootstrap there get the proxy's address in every metadata answer.
		inner=$(free_port)
		sed -i -e "s|^listeners=.*|&,PROXIED://127.0.0.1:$inner|" \
			-e "s|^advertised.listeners=.*|&,PROXIED://127.0.0.1:$pport|" \
			-e "s|^listener.security.protocol.map=.*|&,PROXIED:PLAINTEXT|" "$dir/server.properties"
		echo "$inner" >"$dir/proxied_port"
		echo "$pport" >"$dir/proxy_port"
	fi
	[[ -z $cluster_id ]] && cluster_id=$(new_cluster_id)
	echo "$cluster_id" >"$dir/cluster.id"
	# With a static controller.quorum.voters, format needs no --standalone.
	ensure_kafka_cds
	kafka_java "$dir" format.log
	"${JAVA_CMD[@]}" kafka.tools.StorageTool format \
		-t "$cluster_id" -c "$dir/server.properties" "${scram_args[@]}" >"$dir/format.out" 2>&1 || {
		tail_log "$dir/format.out"
		die "formatting Kafka storage in $dir failed"
	}
	echo "$cport" >"$dir/controller_port"
	echo "$port" >"$dir/port" # written last: marks a complete init
	log "Kafka initialised in $dir (node $node_id, port $port, controller $cport${sport:+, SASL $sport}${tport:+, SASL_SSL $tport})"
}

# new_cluster_id: 16 random bytes in URL-safe base64 without padding; Kafka
# avoids ids that start with '-' (they look like options).
new_cluster_id() {
	local id=-
	while [[ $id == -* ]]; do
		id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
	done
	echo "$id"
}

# kafka_tls DIR TLS_PORT USER PASSWORD: a throwaway CA, a server certificate
# for 127.0.0.1/localhost and a client certificate in DIR/tls/, and a SASL_SSL
# listener on TLS_PORT that requires the client certificate and SASL.
kafka_tls() {
	local dir=$1 tport=$2 user=$3 pw=$4 t=$1/tls
	command -v openssl >/dev/null || apt_install openssl
	mkdir -p "$t"
	(
		cd "$t"
		umask 077
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
			-subj /CN=outboxd-dev-ca -keyout ca-key.pem -out ca.pem
		for who in server client; do
			openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=outboxd-dev-$who" \
				-keyout "$who-key.tmp" -out "$who.csr"
			printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$who.ext"
			openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 30 \
				-extfile "$who.ext" -out "$who.pem"
			openssl pkcs8 -topk8 -nocrypt -in "$who-key.tmp" -out "$who-key.pem" # Kafka reads PKCS#8
			rm -f "$who-key.tmp" "$who.csr" "$who.ext"
		done
		cat server-key.pem server.pem >server-keystore.pem
	) >"$dir/tls.log" 2>&1 || {
		tail_log "$dir/tls.log"
		die "making the TLS certificates in $t failed"
	}
	sed -i -e "s|^listeners=.*|&,SASL_SSL://127.0.0.1:$tport|" \
		-e "s|^advertised.listeners=.*|&,SASL_SSL://127.0.0.1:$tport|" \
		-e "s|^listener.security.protocol.map=.*|&,SASL_SSL:SASL_SSL|" "$dir/server.properties"
	cat >>"$dir/server.properties" <<EOF
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$t/server-keystore.pem
listener.name.sasl_ssl.ssl.truststore.type=PEM
listener.name.sasl_ssl.ssl.truststore.location=$t/ca.pem
listener.name.sasl_ssl.ssl.client.auth=required
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$user="$pw";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
	echo "$tport" >"$dir/tls_port"
}

kafka_start() {
	local dir=${1:?kafka-start DIR} port pid deadline
	[[ -f $dir/port ]] || die "$dir is not a kafka-init'ed instance"
	dir=$(cd "$dir" && pwd)
	port=$(<"$dir/port")
	if kafka_running "$dir"; then
		log "Kafka in $dir already runs (port $port)"
		return 0
	fi
	ensure_kafka_libs
	ensure_kafka_cds
	rm -f "$dir/pid"
	[[ -f $dir/server.log ]] && mv "$dir/server.log" "$dir/server.log.prev"
	# Detached from our session and terminal, with no inherited stdio (a caller
	# reading our output must not wait for the broker). The bash -c records its
	# own pid and execs java, so the pid file names the broker itself.
	kafka_java "$dir" server.log
	# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
	(
		cd "$dir" || exit # as dev/stack's set -e would; shellcheck sees this file alone
		setsid bash -c 'echo $$ >"$0"; exec "$@"' "$dir/pid" \
			"${JAVA_CMD[@]}" kafka.Kafka "$dir/server.properties" \
			</dev/null >>"$dir/stdout.log" 2>&1 8>&- &
	)

	# Ready = the broker logged that it started AND its port accepts TCP.
	deadline=$((SECONDS + START_TIMEOUT))
	while :; do
		pid=$(kafka_pid "$dir" || true)
		if [[ -n $pid ]] && ! alive "$pid"; then
			tail_log "$dir/stdout.log"
			tail_log "$dir/server.log"
			die "Kafka in $dir exited during start"
		fi
		if grep -q 'Kafka Server started' "$dir/server.log" 2>/dev/null && port_open "$port"; then
			break
		fi
		if ((SECONDS >= deadline)); then
			tail_log "$dir/server.log"
			kafka_stop "$dir" kill
			die "Kafka in $dir did not start within ${START_TIMEOUT}s"
		fi
		sleep 0.2
	done
	log "Kafka ready on 127.0.0.1:$port"
}

kafka_stop() {
	local dir=${1:?kafka-stop DIR [kill]} mode=${2:-term} pid deadline
	[[ $mode == term || $mode == kill ]] || die "kafka-stop mode must be kill or empty, not $mode"
	if ! kafka_running "$dir"; then
		rm -f "$dir/pid"
		return 0
	fi
	pid=$(kafka_pid "$dir")
	if [[ $mode == kill ]]; then
		kill -KILL "$pid" 2>/dev/null || true
	else
		kill -TERM "$pid" 2>/dev/null || true
		kill -CONT "$pid" 2>/dev/null || true # a paused (SIGSTOP) broker must see it
		deadline=$((SECONDS + STOP_TIMEOUT))
		while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
		if alive "$pid"; then
			log "Kafka $pid did not stop within ${STOP_TIMEOUT}s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	wait_gone "$pid" 10
	rm -f "$dir/pid"
	log "Kafka in $dir stopped ($mode)"
}

# kafka_nodes DIR: the node folders of a cluster, DIR/kafka1..N, in order.
kafka_nodes() {
	local i=1
	while [[ -f $1/kafka$i/port ]]; do
		echo "$1/kafka$i"
		i=$((i + 1))
	done
}

# kafka_cluster_init DIR N: N broker+controller nodes forming one KRaft quorum
# of N voters, in DIR/kafka1..N, on 2N distinct free ports.
kafka_cluster_init() {
	local usage='kafka-cluster-init DIR N'
	local dir=${1:?$usage} n=${2:?$usage} i p cluster_id voters='' failed=0
	local -a ports=() pids=()
	[[ $n =~ ^[1-9]$ ]] || die "kafka-cluster-init: N must be 1 to 9, not $n"
	[[ -e $dir/kafka1 ]] && die "$dir/kafka1 already exists"
	ensure_kafka_libs
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	while ((${#ports[@]} < 2 * n)); do
		p=$(free_port)
		[[ " ${ports[*]} " == *" $p "* ]] || ports+=("$p")
	done
	for ((i = 1; i <= n; i++)); do
		voters+="${voters:+,}$i@127.0.0.1:${ports[2 * i - 1]}"
	done
	cluster_id=$(new_cluster_id)
	# Formatting starts a JVM per node: do them side by side.
	for ((i = 1; i <= n; i++)); do
		kafka_init "$dir/kafka$i" "${ports[2 * i - 2]}" "${ports[2 * i - 1]}" \
			--node-id "$i" --voters "$voters" --cluster-id "$cluster_id" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || failed=1; done
	((failed == 0)) || die "kafka-cluster-init: formatting a node in $dir failed"
	log "Kafka cluster of $n nodes initialised in $dir (voters $voters)"
}

# kafka_cluster_start DIR: start the nodes that are not running all at once
# (a node waits for a quorum before it reports started) and wait for all.
kafka_cluster_start() {
	local dir=${1:?kafka-cluster-start DIR} node p failed=0
	local -a nodes pids=()
	mapfile -t nodes < <(kafka_nodes "$dir")
	((${#nodes[@]} > 0)) || die "$dir holds no kafka-cluster-init'ed nodes (kafka1, ...)"
	for node in "${nodes[@]}"; do
		kafka_start "$node" &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || failed=1; done
	((failed == 0)) || die "kafka-cluster-start: a node in $dir did not start"
}

# kafka_cluster_stop DIR [kill]: stop all nodes at once (one by one, the last
# ones would wait for a quorum that is already gone).
kafka_cluster_stop() {
	local dir=${1:?kafka-cluster-stop DIR [kill]} mode=${2:-} node p failed=0
	local -a pids=()
	while IFS= read -r node; do
		kafka_stop "$node" ${mode:+"$mode"} &
		pids+=($!)
	done < <(kafka_nodes "$dir")
	for p in "${pids[@]}"; do wait "$p" || failed=1; done
	((failed == 0)) || die "kafka-cluster-stop: a node in $dir did not stop"
}
