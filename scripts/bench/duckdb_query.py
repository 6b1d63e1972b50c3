"""Times queries in DuckDB over Parquet files exposed as the view `raw`.

Usage: duckdb_query.py <query-file> <parquet-files> [threads]
  <query-file> holds one or more queries, each ended by a `;` at the end of a line; they
  run one after the other, as one job.
  <parquet-files> is a glob, or `@<file>` naming a file that lists the Parquet paths one
  per line (a Delta snapshot's files).
Runs the queries once to warm the OS cache, then twice timed, and prints
{"seconds": <best total>, "query_seconds": [<each query, in that run>],
 "rows": [<each query's result rows>], "duckdb": <version>}.
"""
import json
import sys
import time

import duckdb


def queries_in(text: str) -> list[str]:
    out, current = [], []
    for line in text.splitlines():
        current.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(current))
            current = []
    rest = "\n".join(current).strip()
    if rest:
        out.append(rest)
    return out


def main() -> None:
    queries = queries_in(open(sys.argv[1], encoding="utf-8").read())
    files = sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    if files.startswith("@"):
        paths = [p for p in open(files[1:], encoding="utf-8").read().splitlines() if p]
        source = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
    else:
        source = "'" + files.replace("'", "''") + "'"
    con.execute(f"CREATE VIEW raw AS SELECT * FROM read_parquet({source})")
    for q in queries:  # warm the OS cache, as the Rust side's first run does
        con.execute(q).fetchall()
    best = None
    for _ in range(2):
        took, rows = [], []
        for q in queries:
            started = time.perf_counter()
            rows.append(len(con.execute(q).fetchall()))
            took.append(time.perf_counter() - started)
        if best is None or sum(took) < sum(best[0]):
            best = (took, rows)
    print(json.dumps({
        "seconds": sum(best[0]),
        "query_seconds": best[0],
        "rows": best[1],
        "duckdb": duckdb.__version__,
    }))


if __name__ == "__main__":
    main()
