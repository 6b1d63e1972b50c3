"""Times one query in DuckDB over a Parquet glob exposed as the view `raw`.

Usage: duckdb_query.py <query-file> <parquet-glob> [threads]
Prints {"seconds": <best of the timed runs>, "rows": <result rows>, "duckdb": <version>}.
"""
import json
import sys
import time

import duckdb


def main() -> None:
    query = open(sys.argv[1], encoding="utf-8").read()
    glob = sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    quoted = glob.replace("'", "''")
    con.execute(f"CREATE VIEW raw AS SELECT * FROM read_parquet('{quoted}')")
    con.execute(query).fetchall()  # warm the OS cache, as the Rust side's first run does
    best = None
    rows = 0
    for _ in range(2):
        started = time.perf_counter()
        rows = len(con.execute(query).fetchall())
        took = time.perf_counter() - started
        best = took if best is None else min(best, took)
    print(json.dumps({"seconds": best, "rows": rows, "duckdb": duckdb.__version__}))


if __name__ == "__main__":
    main()
