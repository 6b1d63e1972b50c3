#!/usr/bin/env bash
# Runs DuckDB (from PyPI, in a virtualenv cached outside the repo) for the benchmarks that
# compare verdict's DataFusion queries with DuckDB on the same files.
#
# Usage: scripts/duckdb.sh <query-file> <parquet-glob or @file-list> [threads]
#   Creates the view `raw` over the files, runs the queries in <query-file> once to warm the
#   OS cache, then times them and prints one JSON object (scripts/bench/duckdb_query.py).
# Usage: scripts/duckdb.sh --queries <spec.json>
#   Creates the spec's views, then runs the query named on each line of standard input and
#   prints one JSON line per run (scripts/bench/duckdb_queries.py).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=env.sh
. "$here/env.sh"

VERDICT_DUCKDB_VERSION=${VERDICT_DUCKDB_VERSION:-2.0.1}
venv="$VERDICT_CACHE/duckdb-$VERDICT_DUCKDB_VERSION"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import duckdb' 2>/dev/null; then
  mkdir -p "$VERDICT_CACHE"
  echo "installing duckdb==$VERDICT_DUCKDB_VERSION from PyPI into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "duckdb==$VERDICT_DUCKDB_VERSION" >&2
fi

if [ "${1:-}" = "--queries" ]; then
  [ $# -eq 2 ] || { echo "usage: $0 --queries <spec.json>" >&2; exit 2; }
  exec "$venv/bin/python" "$here/bench/duckdb_queries.py" "$2"
fi
[ $# -ge 2 ] || { echo "usage: $0 <query-file> <parquet-glob> [threads]" >&2; exit 2; }
exec "$venv/bin/python" "$here/bench/duckdb_query.py" "$@"
