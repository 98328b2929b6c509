"""What opening a PostgreSQL warehouse connection costs, as the number of tables grows.

ADBC's PostgreSQL driver reads the whole type catalogue (pg_type, and the columns of every
table's row type) whenever a database handle opens. For each ``--tables`` count, in a fresh
PostgreSQL database holding that many tables of a synced table's width, this prints the CPU
(user+system, this process) and wall time per connection of:

* ``per-connection``: ``adbc_driver_postgresql.dbapi.connect``, a handle for each connection
  (changewatch before warehouse/pg_connections.py);
* ``shared-first``: warehouse/pg_connections.py's first connection with the server's types
  (``server_types``, as `changewatch sql` opens), which opens the process's handle, and
  ``shared-later``: its later connections, from that handle;
* ``builtin-first`` and ``builtin-later``: the same for the warehouse's own connections, whose
  handle knows the built-in types and reads no catalogue.

A sync run opens two connections per source, so at 1,000 sources (about 4,000 tables with
their history and watch tables) the difference is paid twice per changed source.

Run from the repository root::

    .venv/bin/python bench/bench_connect.py                       # 0 and 4,000 tables
    .venv/bin/python bench/bench_connect.py --tables 100 --connections 5
"""

from __future__ import annotations

import argparse
import resource
import time
import uuid
from contextlib import closing
from urllib.parse import urlsplit, urlunsplit

import adbc_driver_postgresql.dbapi as adbc
import psycopg2
from changewatch.warehouse import pg_connections

COLUMNS = ", ".join(f"c{i} text" for i in range(12))


def server_typed(uri: str):
    return pg_connections.connect(uri, server_types=True)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_connection(connect, uri: str, count: int) -> tuple[float, float]:
    """Mean CPU and wall milliseconds of opening (and closing) ``count`` connections."""
    began_cpu, began = cpu(), time.perf_counter()
    for _ in range(count):
        connection = connect(uri)
        connection.close()
    return (cpu() - began_cpu) / count * 1000, (time.perf_counter() - began) / count * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[0, 4000])
    parser.add_argument("--connections", type=int, default=20)
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)

    print(f"{'tables':>7} {'way':<15} {'CPU ms/conn':>12} {'wall ms/conn':>13}")
    for tables in args.tables:
        name = f"bench_connect_{uuid.uuid4().hex[:8]}"
        admin = psycopg2.connect(args.pg_url)
        admin.autocommit = True
        with closing(admin), admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        uri = urlunsplit(urlsplit(args.pg_url)._replace(path=f"/{name}"))
        try:
            with closing(psycopg2.connect(uri)) as db, db.cursor() as cur:
                for i in range(tables):
                    cur.execute(f"CREATE TABLE t{i} (id bigint PRIMARY KEY, {COLUMNS})")
                    if i % 200 == 199:  # a transaction's locks are bounded
                        db.commit()
                db.commit()
            ways = (
                ("per-connection", adbc.connect, args.connections),
                ("shared-first", server_typed, 1),
                ("shared-later", server_typed, args.connections),
                ("builtin-first", pg_connections.connect, 1),
                ("builtin-later", pg_connections.connect, args.connections),
            )
            for way, connect, count in ways:
                cpu_ms, wall_ms = per_connection(connect, uri, count)
                print(f"{tables:>7} {way:<15} {cpu_ms:>12.1f} {wall_ms:>13.1f}", flush=True)
        finally:
            admin = psycopg2.connect(args.pg_url)
            admin.autocommit = True
            with closing(admin), admin.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
