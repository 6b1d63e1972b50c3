"""A driver's view of the query service's PostgreSQL wire: psycopg 3 (the Python that
`scripts/services.sh up postgres` installs) reading a parameterised query as it streams, and
through a named (server-side) cursor, as SQLAlchemy's `stream_results` and pandas' `chunksize`
do. Prints one JSON object: the rows read, their sum, the seconds taken.

    psycopg_client.py DSN stream ROWS        # cursor.stream(): the extended protocol
    psycopg_client.py DSN named ROWS CHUNK   # DECLARE … CURSOR, FETCH FORWARD CHUNK
"""

import json
import sys
import time

import psycopg

QUERY = "SELECT value FROM generate_series(1, {rows}) AS g WHERE value > %s"


def main() -> None:
    dsn, mode, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    query = QUERY.format(rows=rows)
    started = time.monotonic()
    count = total = 0
    with psycopg.connect(dsn, autocommit=False) as conn:
        if mode == "stream":
            cur = conn.cursor()
            for (value,) in cur.stream(query, (0,)):
                count += 1
                total += value
        elif mode == "named":
            with conn.cursor(name="verdict_rows") as cur:
                cur.itersize = int(sys.argv[4])
                cur.execute(query, (0,))
                if cur.description is None or cur.description[0].name != "value":
                    raise SystemExit(f"the cursor describes {cur.description!r}")
                for (value,) in cur:
                    count += 1
                    total += value
        else:
            raise SystemExit(f"unknown mode {mode!r}: stream or named")
    print(json.dumps({"rows": count, "sum": total, "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    main()
