"""Idle connections against a normal client, for the query service.

Opens CONNECTIONS TCP connections to the service's HTTP and PostgreSQL ports (half each,
one after another from as many child processes as the open-file limit needs, never sending a byte: what a scanner, a leaking pool or an attacker
leaves behind), and meanwhile, every half second, times a normal client: one HTTP query and
one PostgreSQL query (psycopg, a new connection each time, as a tool connects). Once all
are open it times the client ten more times, counts the idle connections the service has
closed, and prints one JSON object: what the client saw during and after, and the service's
open files and memory (from /proc of --pid).

Run with the Python that `scripts/services.sh up postgres` installs psycopg into:

    $VERDICT_CACHE/psycopg-*/bin/python scripts/idle_connections.py \
        --http 127.0.0.1:8080 --pg 127.0.0.1:5433 --token TOKEN --pid PID
"""

import argparse
import json
import multiprocessing
import os
import resource
import socket
import statistics
import threading
import time
import urllib.request

import psycopg


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"not an address: {text!r} (HOST:PORT)")
    return host, int(port)


class Client:
    """The normal client: its latencies and failures, in ms."""

    def __init__(self, http: tuple[str, int], pg: tuple[str, int], token: str):
        self.url = f"http://{http[0]}:{http[1]}/v1/sql"
        self.dsn = f"postgresql://analyst:{token}@{pg[0]}:{pg[1]}/verdict?connect_timeout=30"
        self.token = token

    def http_once(self) -> float:
        started = time.monotonic()
        request = urllib.request.Request(
            self.url,
            data=b"SELECT COUNT(*) AS n FROM policies",
            headers={"Authorization": f"Bearer {self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
        return (time.monotonic() - started) * 1000

    def pg_once(self) -> float:
        started = time.monotonic()
        with psycopg.connect(self.dsn) as conn:
            conn.execute("SELECT COUNT(*) AS n FROM policies").fetchall()
        return (time.monotonic() - started) * 1000

    def round(self, into: dict) -> None:
        for name, once in (("http", self.http_once), ("pg", self.pg_once)):
            try:
                into[name].append(once())
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                into[name + "_failed"].append(str(e)[:200])


def summary(ms: list[float]) -> dict:
    if not ms:
        return {"count": 0}
    ordered = sorted(ms)
    return {
        "count": len(ms),
        "median_ms": round(statistics.median(ordered), 1),
        "max_ms": round(ordered[-1], 1),
    }


def proc(pid: int) -> dict:
    out = {"open_files": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key + "_mib"] = round(int(value.split()[0]) / 1024, 1)
    return out


def hold(pipe, http: tuple[str, int], pg: tuple[str, int], n: int) -> None:
    """Opens `n` idle connections, alternating between the two ports; says how many opened
    and failed, then, when asked, how many of them the service has closed."""
    idle: list[socket.socket] = []
    refused = 0
    for i in range(n):
        try:
            idle.append(socket.create_connection(http if i % 2 == 0 else pg, timeout=10))
        except OSError:
            refused += 1
    pipe.send((len(idle), refused))
    pipe.recv()
    closed = 0
    for s in idle:
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    pipe.send(closed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http", required=True, help="the service's HTTP address, HOST:PORT")
    p.add_argument("--pg", required=True, help="its PostgreSQL address, HOST:PORT")
    p.add_argument("--token", required=True, help="a bearer token (the pg password)")
    p.add_argument("--pid", type=int, required=True, help="the service's process id")
    p.add_argument("--connections", type=int, default=20_000, help="idle connections to open")
    args = p.parse_args()
    http, pg = parse_addr(args.http), parse_addr(args.pg)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    client = Client(http, pg, args.token)
    before = {"http": [], "pg": [], "http_failed": [], "pg_failed": []}
    client.round(before)
    if before["http_failed"] or before["pg_failed"]:
        raise SystemExit(f"the normal client fails before any idle connection: {before}")
    service_before = proc(args.pid)

    during = {"http": [], "pg": [], "http_failed": [], "pg_failed": []}
    opening = threading.Event()
    opening.set()

    def keep_asking() -> None:
        while opening.is_set():
            client.round(during)
            time.sleep(0.5)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    # Held by child processes, each within its open-file limit.
    per_holder = max(1, min(resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200, args.connections))
    holders = []
    started = time.monotonic()
    for first in range(0, args.connections, per_holder):
        n = min(per_holder, args.connections - first)
        parent, child = multiprocessing.Pipe()
        proc_ = multiprocessing.Process(target=hold, args=(child, http, pg, n))
        proc_.start()
        holders.append((proc_, parent))
    opened = refused = 0
    for _, pipe in holders:
        o, r = pipe.recv()
        opened += o
        refused += r
    opened_in = time.monotonic() - started
    opening.clear()
    asker.join()
    service_held = proc(args.pid)

    after = {"http": [], "pg": [], "http_failed": [], "pg_failed": []}
    for _ in range(10):
        client.round(after)
    closed = 0
    for p_, pipe in holders:
        pipe.send("count")
        closed += pipe.recv()
        p_.join()
    print(
        json.dumps(
            {
                "bench": "idle_connections",
                "connections": args.connections,
                "opened": opened,
                "refused_or_timed_out": refused,
                "opened_in_s": round(opened_in, 1),
                "closed_by_the_service": closed,
                "client_during": {
                    "http": summary(during["http"]),
                    "pg": summary(during["pg"]),
                    "http_failed": during["http_failed"][:5],
                    "pg_failed": during["pg_failed"][:5],
                },
                "client_after": {
                    "http": summary(after["http"]),
                    "pg": summary(after["pg"]),
                    "http_failed": after["http_failed"][:5],
                    "pg_failed": after["pg_failed"][:5],
                },
                "client_before_ms": {"http": before["http"][0], "pg": before["pg"][0]},
                "service_before": service_before,
                "service_holding": service_held,
            }
        )
    )


if __name__ == "__main__":
    main()
