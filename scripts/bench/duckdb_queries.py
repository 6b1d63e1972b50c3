"""Times named queries in DuckDB over views defined in a JSON spec.

Usage: duckdb_queries.py <spec.json>
The spec: {"threads": n, "runs": n, "views": {name: select-sql}, "queries": [{"name", "sql"}]}.
Each query runs once to warm the OS cache, then `runs` times; prints one JSON line per
query: {"query": name, "p50_seconds": median, "rows": rows, "duckdb": version}.
"""
import json
import statistics
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
    runs = int(spec.get("runs", 5))
    for q in spec["queries"]:
        rows = len(con.execute(q["sql"]).fetchall())
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            con.execute(q["sql"]).fetchall()
            times.append(time.perf_counter() - started)
        print(json.dumps({"query": q["name"], "p50_seconds": statistics.median(times),
                          "rows": rows, "duckdb": duckdb.__version__}), flush=True)


if __name__ == "__main__":
    main()
