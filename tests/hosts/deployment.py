"""changewatch on several hosts (tests/hosts/netns.py), wired as deploy/dagster-celery.yaml says.

- ``db``: its own PostgreSQL (initdb + pg_ctl in a temporary folder, listening only on the
  host's address): Dagster's storage and the warehouse;
- ``control``: Redis (the Celery broker and result backend), dagster-daemon and
  dagster-webserver (which load the code location themselves), and with ``webhooks=True`` the
  webhook receiver (``changewatch webhooks``, its inbox Dagster's PostgreSQL on ``db``);
- ``worker1``, ``worker2``...: a Celery worker each, running the runs the daemon launches;
- ``api``: the demo trackers the sources poll, the webhook endpoint notifications go to and,
  with ``email=True``, an SMTP server (aiosmtpd) for a watch of the first source (this
  process's threads, their sockets made inside the host).

Every host has a DAGSTER_HOME of its own (no shared disk but the code and the watches file,
which a deployment ships with its image).
"""

from __future__ import annotations

import asyncio
import base64
import email
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg2
import yaml
from aiosmtpd.controller import Controller
from changewatch.sources.demo import DemoAPIServer, DemoTracker
from cpu_quota import CpuQuota
from cw_testing import REPO, demo_source_settings
from netns import Host, Network
from patience import wait_working

__all__ = [
    "HOOK_SECRET_ENV",
    "PARENT",
    "Deployment",
    "MailSink",
    "WebhookSink",
    "changes",
    "delivered",
    "mutate",
    "placed",
    "runs",
    "started_syncing",
    "will_retry",
]

PARENT = "dagster/parent_run_id"  # a retry's tag: the run it retries
# The variable holding the sources' Standard Webhooks secret: only the receiver's host has it.
HOOK_SECRET_ENV = "CW_HOSTS_HOOK_SECRET"
RECEIVER_PORT = 8088
# A wait's ceiling when the caller sets none. The stall rule (tests/patience.py) never fires
# here: the daemon and its sensors work every few seconds whatever the test waits for, so a
# condition that can no longer come true would be waited for until CI's own limit. The longest
# wait of a passing tier is about a minute (the first syncs).
WAIT_LIMIT_S = 600.0

BIN = Path(sys.executable).parent
PG_BIN = Path(
    subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
)
COLUMNS = {
    "number": "bigint",
    "title": "text",
    "state": "text",
    "updated_at": "timestamp",
}


class WebhookSink:
    """Records every POST: (webhook-id header, body). Its socket lives on ``host``."""

    def __init__(self, host: Host):
        self.posts: list[tuple[str, dict, float]] = []  # webhook-id, body, when it arrived
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with sink.lock:
                    sink.posts.append(
                        (self.headers.get("webhook-id", ""), json.loads(body), time.time())
                    )
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        with host.entered():
            self.server = ThreadingHTTPServer((host.address, 0), Handler)
        self.url = f"http://{host.address}:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Controller(Controller):
    """aiosmtpd's Controller on a free port (port=0), which it cannot find out by itself."""

    def _trigger_server(self) -> None:
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


class MailSink:
    """An SMTP server on ``host``: the notification ids of the messages it accepted.

    ``hold()`` arms it: the next message's DATA is received and then not answered until
    ``release()``, when it is refused (451) and not kept: a send cut short before the server
    accepted the message, which is what a worker host lost mid-send leaves. ``held`` is set
    then, with the sender's address in ``held_peer`` and the message's notification id in
    ``held_id``."""

    def __init__(self, host: Host):
        self.accepted: list[str] = []  # X-Changewatch-Notification-Id of each message
        self.armed = False
        self.held = threading.Event()
        self.released = threading.Event()
        self.held_peer = self.held_id = ""
        with host.entered():  # the server's thread starts here, in the host's namespace
            self.controller = _Controller(self, hostname=host.address, port=0)
            self.controller.start()
        self.host, self.port = host.address, self.controller.port

    def hold(self) -> None:
        self.held.clear()
        self.released.clear()
        self.armed = True

    def release(self) -> None:
        self.released.set()

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802
        message = email.message_from_bytes(envelope.original_content or envelope.content)
        notification = str(message["X-Changewatch-Notification-Id"])
        if self.armed:
            self.armed = False
            self.held_peer, self.held_id = session.peer[0], notification
            self.held.set()
            while not self.released.is_set():
                await asyncio.sleep(0.05)
            return "451 4.3.0 not accepted"
        self.accepted.append(notification)
        return "250 OK"

    def close(self) -> None:
        self.release()
        self.controller.stop()


@dataclass(frozen=True)
class Served:
    """One source's demo tracker, and the API address and path it is served at."""

    tracker: DemoTracker
    url: str
    path: str


class Deployment:
    """The hosts, their services, and handles to look at them from the ``control`` host."""

    def __init__(
        self,
        workers: int = 2,
        sources: int = 4,
        issues: int = 20,
        concurrency: int = 1,
        interval: float = 10,
        pin: bool = False,
        webhooks: bool = False,
        webserver: bool = True,
        cpu_quota: float | None = None,
        email: bool = False,
        jitter: float = 0,
    ):
        # pin: each worker host on a core of its own (worker1 on CPU 0, worker2 on CPU 1...).
        # webhooks: every source takes Standard Webhooks at /hooks/<source> on the receiver
        # (started by start_receiver), polled only to reconcile, once an hour.
        self.interval, self.pin = interval, pin
        self.webhooks, self.webserver = webhooks, webserver
        # email: the first source's changes also go by e-mail (watch "mail_tracker_0").
        self.email = email
        # jitter: each source's slots shifted by up to this (its stable offset), so sources
        # come due at different ticks and make several runs, not one batch a interval.
        self.jitter = jitter
        # cpu_quota: each worker host in a cgroup of its own, at most this many cores' time
        # (tests/hosts/cpu_quota.py), so the workers are the bottleneck at a known size.
        self.cpu_quota = cpu_quota
        self.quotas: dict[str, CpuQuota] = {}
        self.hook_secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        self.concurrency = concurrency
        self.stack = ExitStack()
        self.root = Path(tempfile.mkdtemp(prefix="cw-hosts-"))
        self.logs = self.root / "logs"
        self.logs.mkdir()
        self.procs: dict[str, subprocess.Popen] = {}
        self.n_workers, self.n_sources, self.issues = workers, sources, issues

    # -- setting up ---------------------------------------------------------------------------
    def __enter__(self) -> Deployment:
        try:
            self.net = self.stack.enter_context(Network())
            self.db = self.net.add("db")
            self.control = self.net.add("control")
            self.workers = [self.net.add(f"worker{i + 1}") for i in range(self.n_workers)]
            self.api = self.net.add("api")
            self.start_postgres()
            # One demo API on the api host serves every source's tracker, each a repository
            # of its own: a server (and a thread polling for shutdown) per source took a core
            # of the bench's process by itself at 2,000 sources.
            trackers = [
                DemoTracker(issues=self.issues, seed=i, repo=f"acme/tracker-{i}")
                for i in range(self.n_sources)
            ]
            with self.api.entered():
                api = DemoAPIServer(trackers[0], host=self.api.address, more=trackers[1:])
                api.start()
            self.stack.callback(api.stop)
            self.trackers = {
                f"tracker_{i}": Served(t, api.url, f"/repos/{t.repo}/issues")
                for i, t in enumerate(trackers)
            }
            self.sink = WebhookSink(self.api)
            self.stack.callback(self.sink.close)
            if self.email:
                self.mail = MailSink(self.api)
                self.stack.callback(self.mail.close)
            self.config = self.write_watches()
            self.start_control()
            for i, worker in enumerate(self.workers):
                cpu = i % (os.cpu_count() or 1) if self.pin else None
                self.start_worker(worker, cpu=cpu, concurrency=self.concurrency)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()  # kills every process of every host, removes the namespaces
        for proc in self.procs.values():
            proc.wait(timeout=30)  # killed above: reaped here
        for quota in self.quotas.values():
            quota.close()  # empty now
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def pg_dir(self) -> Path:
        return self.root / "pg"

    def pg(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv]

    def start_postgres(self) -> None:
        self.pg_dir.mkdir()
        shutil.chown(self.pg_dir, "postgres", "postgres")
        self.root.chmod(0o755)
        done = subprocess.run(
            self.pg(
                str(PG_BIN / "initdb"),
                "-D",
                str(self.pg_dir / "data"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        data = self.pg_dir / "data"
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.db.address}'\nport = 5432\n"
                f"unix_socket_directories = '{self.pg_dir}'\nmax_connections = 300\n"
                # A test server: durability is not what these tests look at.
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            )
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.net.subnet}.0/24 trust\n")
        self.pg_ctl("start")
        for name in ("dagster", "warehouse"):
            self.db.run(
                self.pg(
                    str(PG_BIN / "psql"),
                    "-h",
                    self.db.address,
                    "-U",
                    "postgres",
                    "-qc",
                    f"CREATE DATABASE {name}",
                ),
                check=True,
                capture_output=True,
            )

    def pg_ctl(self, action: str) -> None:
        """Start or stop the db host's PostgreSQL (``stop`` is a fast shutdown: sessions cut)."""
        argv = [str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir / "data"), "-w", "-m", "fast"]
        if action == "start":
            argv += ["-l", str(self.pg_dir / "server.log")]
        done = self.db.run(self.pg(*argv, action), capture_output=True, text=True)
        assert done.returncode == 0, f"pg_ctl {action}: {done.stdout}{done.stderr}"

    @property
    def dagster_url(self) -> str:
        return f"postgresql+psycopg2://postgres@{self.db.address}:5432/dagster"

    @property
    def warehouse_url(self) -> str:
        return f"postgresql://postgres@{self.db.address}:5432/warehouse?schema=cw"

    def write_watches(self) -> Path:
        sources = [
            demo_source_settings(
                server.url,
                COLUMNS,
                path=server.path,
                name=name,
                table=name,
                sync="snapshot",
                interval=self.interval,
                jitter=self.jitter,
                probe=False,
            )
            for name, server in self.trackers.items()
        ]
        if self.webhooks:
            for source in sources:
                source["webhook"] = {
                    "path": f"/hooks/{source['name']}",
                    "secret_env": HOOK_SECRET_ENV,
                    "provider": "standard",
                    "reconcile": "1h",
                }
        watches = [
            {
                "name": f"every_change_{name}",
                "source": name,
                "where": "kind = 'insert' OR kind = 'update' OR kind = 'delete'",
                "channels": ["hook"],
                "dedupe": "per_transition",
                "title": "Change #{{ key }}",
            }
            for name in self.trackers
        ]
        channels: list[dict] = [{"name": "hook", "type": "webhook", "url": self.sink.url}]
        if self.email:
            channels.append(
                {
                    "name": "mail",
                    "type": "email",
                    "host": self.mail.host,
                    "port": self.mail.port,
                    "security": "none",  # a relay on the private network, as the test's is
                    "timeout": 10,  # at most half the delivery lease, as the file checks
                    "from": "changewatch@example.org",
                    "to": ["ops@example.org"],
                }
            )
            first = next(iter(self.trackers))
            watches.append(
                {
                    "name": f"mail_{first}",
                    "source": first,
                    "where": "kind = 'update'",
                    "channels": ["mail"],
                    "title": "Updated #{{ key }}",
                }
            )
        config = {
            "version": 1,
            "polling": {"tick": 5},
            # A send cut short by a lost host is settled after this: sent again under the
            # same webhook-id for webhooks, parked (never sent again) for e-mail.
            "delivery": {"lease": 20},
            "sources": sources,
            "channels": channels,
            "watches": watches,
        }
        path = self.root / "watches.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def env(self, host: Host) -> dict[str, str]:
        home = self.root / "homes" / host.name
        if not home.exists():
            home.mkdir(parents=True)
            settings = yaml.safe_load((REPO / "deploy" / "dagster-celery.yaml").read_text())
            # As deploy/dagster-celery.yaml says: runs at once = the workers' slots, so a run
            # waits in Dagster's queue, not in Celery's past run monitoring's start timeout.
            runs_at_once = self.n_workers * self.concurrency
            settings["concurrency"]["runs"]["max_concurrent_runs"] = runs_at_once
            (home / "dagster.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
            (home / "workspace.yaml").write_text(
                yaml.safe_dump(
                    {
                        "load_from": [
                            {
                                "python_module": {
                                    "module_name": "changewatch.pipeline.definitions.code_location",
                                    "location_name": "changewatch",
                                }
                            }
                        ]
                    }
                )
            )
        broker = f"redis://{self.control.address}:6379"
        return {
            k: v for k, v in os.environ.items() if not k.startswith(("CHANGEWATCH_", "DAGSTER_"))
        } | {
            "DAGSTER_HOME": str(home),
            "DAGSTER_PG_URL": self.dagster_url,
            "CHANGEWATCH_CONFIG": str(self.config),
            "CHANGEWATCH_WAREHOUSE_URL": self.warehouse_url,
            "CHANGEWATCH_CELERY_BROKER": f"{broker}/0",
            "CHANGEWATCH_CELERY_BACKEND": f"{broker}/1",
        }

    def spawn(
        self,
        host: Host,
        name: str,
        argv: list[str],
        cpu: int | None = None,
        extra_env: dict[str, str] | None = None,
        quota: CpuQuota | None = None,
    ) -> None:
        if cpu is not None:
            argv = ["taskset", "-c", str(cpu), *argv]
        command = host.command(argv)
        if quota is not None:
            # Joined outside `ip netns exec`, which mounts a sysfs of its own without the
            # cgroup trees; the group is kept through its exec and by every child.
            command = quota.wrap(command)
        env = self.env(host) | (extra_env or {})
        out = (self.logs / f"{name}.log").open("a")
        self.stack.callback(out.close)
        if name in self.procs:
            self.procs[name].wait(timeout=30)  # a restart: the one before is gone
        self.procs[name] = subprocess.Popen(
            command, env=env, cwd=env["DAGSTER_HOME"], stdout=out, stderr=subprocess.STDOUT
        )

    def start_control(self) -> None:
        c = self.control
        self.spawn(
            c,
            "redis",
            [
                "redis-server",
                "--bind",
                c.address,
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
        )
        env = self.env(c)
        # The deployment's one-off step (deploy/docker-compose.yml's `init`).
        done = c.run(
            [
                str(BIN / "dagster"),
                "instance",
                "concurrency",
                "set",
                "warehouse/notifications",
                "1",
            ],
            env=env,
            cwd=env["DAGSTER_HOME"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        self.spawn(c, "daemon", [str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"])
        if self.webserver:
            self.spawn(
                c,
                "webserver",
                [
                    str(BIN / "dagster-webserver"),
                    *("-h", c.address, "-p", "3000", "-w", "workspace.yaml"),
                ],
            )

    # -- the webhook receiver, on the control host ------------------------------------------
    @property
    def receiver_url(self) -> str:
        return f"http://{self.control.address}:{RECEIVER_PORT}"

    def start_receiver(self) -> None:
        """``changewatch webhooks`` on the control host: no CHANGEWATCH_WEBHOOK_INBOX, so its
        inbox is Dagster's PostgreSQL (DAGSTER_PG_URL), the one the daemon's sensor reads."""
        argv = [str(BIN / "changewatch"), "webhooks", "--host", self.control.address]
        self.spawn(
            self.control,
            "receiver",
            [*argv, "--port", str(RECEIVER_PORT)],
            extra_env={HOOK_SECRET_ENV: self.hook_secret},
        )

    def receiver_listening(self) -> bool:
        with self.control.entered(), socket.socket() as probe:
            probe.settimeout(1)
            return probe.connect_ex((self.control.address, RECEIVER_PORT)) == 0

    def kill_receiver(self) -> None:
        """SIGKILL the receiver (``ip netns exec`` execs it: the Popen's pid is its own)."""
        proc = self.procs["receiver"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def start_worker(self, host: Host, cpu: int | None = None, concurrency: int = 2) -> None:
        app = "changewatch.pipeline.definitions.celery_worker"
        argv = [str(BIN / "celery"), "-A", app, "worker", "-n", f"{host.name}@%h", "-Q", "dagster"]
        argv += ["--concurrency", str(concurrency), "--loglevel", "INFO"]
        quota = None
        if self.cpu_quota is not None:
            if host.name not in self.quotas:  # a restarted host keeps its group
                self.quotas[host.name] = CpuQuota(f"cw-{host.name}", self.cpu_quota)
            quota = self.quotas[host.name]
        self.spawn(host, host.name, argv, cpu=cpu, quota=quota)

    # -- looking -------------------------------------------------------------------------------
    def all_pids(self) -> list[int]:
        return [pid for host in self.net.hosts.values() for pid in host.pids()]

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def logs_tail(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.logs.iterdir())
        )

    def query(self, sql: str, database: str = "warehouse", args: tuple = ()) -> list[tuple]:
        """Rows of ``sql`` on the db host, asked from the control host."""
        with self.control.entered():
            con = psycopg2.connect(host=self.db.address, user="postgres", dbname=database)
        try:
            with con, con.cursor() as cur:
                if database == "warehouse":
                    cur.execute("SET search_path TO cw")
                cur.execute(sql, args)
                return cur.fetchall()
        finally:
            con.close()

    def wait(
        self,
        condition: Callable[[], bool],
        what: str,
        limit: float | None = None,
        progress: Callable[[], object] | None = None,
    ) -> float:
        def checked() -> bool:
            for name in ("redis", "daemon"):
                assert self.procs[name].poll() is None, f"{name} ended\n{self.logs_tail()}"
            return condition()

        try:
            return wait_working(
                checked,
                pids=self.all_pids,
                progress=progress or (lambda: None),
                limit=WAIT_LIMIT_S if limit is None else limit,
                what=what,
            )
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.logs_tail()}") from None


def runs(d: Deployment) -> dict[str, dict]:
    """Every run: status, its Celery task id, its parent (a retry's), from Dagster's storage."""
    rows = d.query(
        "SELECT r.run_id, r.status, t.key, t.value FROM runs r LEFT JOIN run_tags t"
        " ON t.run_id = r.run_id AND t.key IN ('dagster-celery/task_id', %s)",
        database="dagster",
        args=(PARENT,),
    )
    found: dict[str, dict] = {}
    for run_id, status, key, value in rows:
        found.setdefault(run_id, {"status": status})[key] = value
    return found


def placed(d: Deployment) -> dict[str, str]:
    """Celery task id -> the worker host that received it (from the workers' logs)."""
    where = {}
    for host in d.workers:
        for task in re.findall(r"Task execute_job\[([0-9a-f-]+)\] received", d.log(host.name)):
            where[task] = host.name
    return where


def changes(d: Deployment) -> Counter:
    """How many times each (source, kind, key) change was recorded."""
    found: Counter = Counter()
    for name in d.trackers:
        [(exists,)] = d.query("SELECT to_regclass(%s) IS NOT NULL", args=(f"cw.{name}_changes",))
        if exists:
            for kind, key in d.query(f'SELECT kind, object_key FROM "{name}_changes"'):
                found[(name, kind, int(key))] += 1
    return found


def mutate(d: Deployment, expected: Counter, **counts: int) -> None:
    """Change every tracker; count each change in ``expected`` (a key updated in two rounds is
    two changes). Waits first until every change so far is recorded: a key changed again
    before its last change was synced would fold into one, and ``expected`` would wait for two."""
    d.wait(lambda: changes(d) >= expected, "the changes so far")
    for name, server in d.trackers.items():
        done = server.tracker.mutate(**counts)
        for kind, keys in (("insert", "created"), ("update", "updated"), ("delete", "deleted")):
            expected.update((name, kind, k) for k in done[keys])


def delivered(d: Deployment, channel: str = "hook") -> bool:
    """Whether there are deliveries by ``channel`` and every one was sent."""
    [(exists,)] = d.query("SELECT to_regclass('cw.deliveries') IS NOT NULL")
    if not exists:
        return False
    rows = d.query(
        "SELECT status, count(*) FROM deliveries WHERE channel = %s GROUP BY status",
        args=(channel,),
    )
    return bool(rows) and all(status == "sent" for status, _ in rows)


def started_syncing(d: Deployment, since: float) -> str | None:
    """A run started with a sync under way since ``since`` (epoch seconds)."""
    [(exists,)] = d.query("SELECT to_regclass('cw.sync_runs') IS NOT NULL")
    if not exists:
        return None
    for run_id, run in runs(d).items():
        if run["status"] == "STARTED":
            syncing = d.query(
                "SELECT count(*) FROM sync_runs WHERE dagster_run_id = %s"
                " AND started_at > to_timestamp(%s)",
                args=(run_id, since),
            )
            if syncing[0][0]:
                return run_id
    return None


def will_retry(d: Deployment, run_id: str) -> bool:
    """Whether Dagster's run retries will retry the failed run ``run_id`` (its tag, once
    the daemon has decided)."""
    query = "SELECT value FROM run_tags WHERE run_id = %s AND key = 'dagster/will_retry'"
    d.wait(lambda: bool(d.query(query, database="dagster", args=(run_id,))), "the retry decision")
    [(value,)] = d.query(query, database="dagster", args=(run_id,))
    return value == "true"
