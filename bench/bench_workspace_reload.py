"""The daemon's memory across its workspace re-reads, with glibc's allocator defaults and with
deploy/'s settings, side by side.

``dagster-daemon`` re-reads the whole code location from the code server every minute
(``RELOAD_WORKSPACE_INTERVAL`` in dagster/_daemon/controller.py): a new gRPC client fetches
the repository snapshot (at 1,000 sources some 2,000 asset nodes and 3,000 checks) and the
old one is dropped. This bench isolates that step. It writes bench_fleet's watches file of
``--sources`` plain sources, starts one code server on it (``dagster code-server start``, as
deploy/ does), and then two clients at once, each doing what the daemon does
(``WorkspaceProcessContext.refresh_workspace``) ``--reloads`` times in a row:

* ``glibc``: the allocator's defaults (up to 8 arenas per core);
* ``deploy``: the variables deploy/docker-compose.yml sets for the daemon.

Every ``--every`` re-reads each client reports its RSS (``VmRSS``), its count of live Python
objects after a full collection (flat while RSS grows means the allocator keeps freed memory,
not a leak of objects), and its CPU so far. Printed: a table of both clients' RSS and
objects by re-read, each one's growth over the second half of the re-reads (flat: at most
``TARGET_FLAT``), and the CPU a re-read costs the daemon.

Run from the repository root::

    .venv/bin/python bench/bench_workspace_reload.py
    .venv/bin/python bench/bench_workspace_reload.py --sources 100 --reloads 20 --every 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench_fleet import BIN, MIB, TARGET_FLAT, deploy_daemon_env, watches_file
from proctree import die_with_parent, free_port, listening, rss_bytes, stop_tree

# The code server loads the watches file but connects to no warehouse until a run starts.
IDLE_WAREHOUSE = "postgresql://postgres@127.0.0.1:5432/test?schema=bench_workspace_reload"


def client(port: int, reloads: int, every: int) -> None:
    """The daemon's re-read, ``reloads`` times; a JSON line on stdout every ``every``."""
    from dagster import DagsterInstance
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceLoadTarget

    class CodeServer(WorkspaceLoadTarget):
        """deploy/workspace.yaml's one grpc_server entry."""

        def create_origins(self):
            origin = GrpcServerCodeLocationOrigin(
                host="127.0.0.1", port=port, location_name="changewatch"
            )
            return [origin]

    def report(done: int) -> None:
        gc.collect()
        figures = {
            "reloads": done,
            "rss": rss_bytes(os.getpid()) / MIB,
            "objects": len(gc.get_objects()),
        }
        print(json.dumps(figures | {"cpu": time.process_time()}), flush=True)

    with tempfile.TemporaryDirectory() as home:
        instance = DagsterInstance.local_temp(home)
        with WorkspaceProcessContext(instance, CodeServer()) as context:
            report(0)
            for done in range(1, reloads + 1):
                context.refresh_workspace()
                if done % every == 0:
                    report(done)


def measure(args: argparse.Namespace, folder: Path) -> dict[str, list[dict]]:
    """One code server; both clients against it at once; their reports by variant."""
    config = watches_file(folder, "http://127.0.0.1:9", args.sources, 300, 0.95)
    port = free_port()
    env = dict(os.environ) | {
        "CHANGEWATCH_CONFIG": str(config),
        "CHANGEWATCH_WAREHOUSE_URL": IDLE_WAREHOUSE,
        "DAGSTER_HOME": str(folder),
    }
    # Neither variant's allocator settings for the server: it is not what is measured.
    env = {key: value for key, value in env.items() if not key.startswith("MALLOC_")}
    variants = {"glibc": env, "deploy": env | deploy_daemon_env()}
    with ExitStack() as stack:
        code = subprocess.Popen(
            [str(BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p", str(port)]
            + ["-m", "changewatch.pipeline.definitions.code_location"],
            env=env,
            stdout=stack.enter_context((folder / "code.log").open("w")),
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        stack.callback(stop_tree, code)
        deadline = time.time() + args.start_limit
        while not listening(port):
            if code.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the code server did not start: see {folder / 'code.log'}")
            time.sleep(0.5)
        print(f"  code server up on {args.sources} sources; {args.reloads} re-reads", flush=True)
        command = [sys.executable, __file__, "--client", str(port)]
        command += ["--reloads", str(args.reloads), "--every", str(args.every)]
        clients = {
            name: subprocess.Popen(
                command,
                env=variant_env,
                stdout=subprocess.PIPE,
                stderr=stack.enter_context((folder / f"{name}.log").open("w")),
                text=True,
                preexec_fn=die_with_parent,
            )
            for name, variant_env in variants.items()
        }
        # A few short lines each: reading one client to its end cannot block the other.
        reports = {name: list(map(json.loads, proc.stdout)) for name, proc in clients.items()}
        for name, proc in clients.items():
            if proc.wait() != 0:
                raise SystemExit(f"the {name} client failed: see {folder / f'{name}.log'}")
    return reports


def report(reports: dict[str, list[dict]], sources: int) -> None:
    names = list(reports)
    print(f"\nRSS and live Python objects by re-read, {sources} sources:")
    print(f"  {'re-reads':>8}" + "".join(f"{name + ' MiB':>14}{'objects':>12}" for name in names))
    for rows in zip(*reports.values(), strict=True):
        cells = "".join(f"{row['rss']:>14.0f}{row['objects']:>12,}" for row in rows)
        print(f"  {rows[0]['reloads']:>8}{cells}")
    for name, rows in reports.items():
        spent = (rows[-1]["cpu"] - rows[1]["cpu"]) / (rows[-1]["reloads"] - rows[1]["reloads"])
        print(f"  {name}: {spent:.2f} CPU s per re-read (the client's, the daemon's share)")
    for name, rows in reports.items():
        # As bench_fleet's memory line: the last report against the middle one.
        middle, last = rows[(len(rows) - 1) // 2]["rss"], rows[-1]["rss"]
        change = last / middle - 1
        verdict = "flat" if change <= TARGET_FLAT else "GROWING"
        print(
            f"{name}: RSS over the second half of the re-reads {change * 100:+.1f}% "
            f"({middle:.0f} -> {last:.0f} MiB): {verdict} (flat: at most +{TARGET_FLAT * 100:g}%)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=1000)
    parser.add_argument("--reloads", type=int, default=60, help="re-reads by each client")
    parser.add_argument("--every", type=int, default=10, help="re-reads between reports")
    parser.add_argument("--start-limit", type=float, default=300.0)
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client(args.client, args.reloads, args.every)
        return 0
    print(
        f"bench_workspace_reload: {args.sources} sources, {args.reloads} re-reads, deploy's "
        f"allocator settings {deploy_daemon_env()}; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench_workspace_reload_") as tmp:
        report(measure(args, Path(tmp)), args.sources)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
