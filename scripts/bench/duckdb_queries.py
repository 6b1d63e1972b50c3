"""Runs named queries in DuckDB, one at a time as asked, over views defined in a JSON spec.

Usage: duckdb_queries.py <spec.json>
The spec: {"threads": n, "views": {name: select-sql}, "queries": [{"name", "sql"}]}.
Reads one query name per line on standard input, runs that query once and prints one JSON
line: {"query": name, "seconds": wall time, "rows": rows, "duckdb": version}. The caller
times its own engine between these calls, so both engines meet the same machine.
"""
import json
import sys
import time

import duckdb


def main() -> None:
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    con = duckdb.connect()
    con.execute(f"SET threads = {int(spec.get('threads', 2))}")
    con.execute("SET TimeZone = 'UTC'")
    for name, select in spec["views"].items():
        con.execute(f"CREATE VIEW {name} AS {select}")
    queries = {q["name"]: q["sql"] for q in spec["queries"]}
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        if name not in queries:
            print(json.dumps({"query": name, "error": "no such query in the spec"}), flush=True)
            continue
        started = time.perf_counter()
        rows = len(con.execute(queries[name]).fetchall())
        seconds = time.perf_counter() - started
        print(json.dumps({"query": name, "seconds": seconds, "rows": rows,
                          "duckdb": duckdb.__version__}), flush=True)


if __name__ == "__main__":
    main()
