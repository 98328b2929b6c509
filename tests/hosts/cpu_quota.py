"""A CPU quota for a host's processes: a cgroup they cannot use more CPU time than.

``taskset`` keeps a worker host on its core, but the core is not its own: the other hosts (and
the machine's other work) run there too, and a worker left alone takes all of it. A quota makes
the worker the bottleneck at a known size (``cores`` of CPU time per wall second), whatever
else the machine does, so one worker against two measures the workers' capacity.

cgroup v2's ``cpu.max`` where the cpu controller is in the unified hierarchy; else cgroup v1's
``cpu.cfs_quota_us`` (the same CFS bandwidth control under its v1 name), as on this machine,
whose unified hierarchy holds no controllers. A process joins before it execs (``wrap``, around
``ip netns exec``, whose own sysfs has no cgroup trees), so everything it starts is in the
group from the first instruction. Root only.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

__all__ = ["CpuQuota"]

PERIOD_US = 100_000
V2_ROOT = Path("/sys/fs/cgroup")
V1_CPU = Path("/sys/fs/cgroup/cpu")


def _v2_has_cpu() -> bool:
    controllers = V2_ROOT / "cgroup.controllers"
    return controllers.exists() and "cpu" in controllers.read_text().split()


class CpuQuota:
    """A new cgroup limited to ``cores`` CPUs' worth of time; removed by ``close``."""

    def __init__(self, name: str, cores: float) -> None:
        self.cores = cores
        quota = round(cores * PERIOD_US)
        leaf = f"{name}-{uuid.uuid4().hex[:6]}"
        if _v2_has_cpu():
            subtree = V2_ROOT / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu")
            self.path = V2_ROOT / leaf
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            self.version = 2
        elif V1_CPU.is_dir():
            self.path = V1_CPU / leaf
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            self.version = 1
        else:
            raise RuntimeError("no cgroup cpu controller: neither v2 cpu.max nor v1 cpu")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the group: the shell joins it, then execs ``argv``."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "cpu-quota", *argv]

    def stat(self) -> dict[str, int]:
        """The group's cpu.stat (v1: nr_periods, nr_throttled, throttled_time in ns)."""
        lines = (self.path / "cpu.stat").read_text().split("\n")
        return {k: int(v) for k, v in (line.split() for line in lines if line.strip())}

    def throttled(self, before: dict[str, int]) -> float:
        """The share of scheduling periods since ``before`` in which the quota ran out."""
        now = self.stat()
        periods = now["nr_periods"] - before.get("nr_periods", 0)
        return (now["nr_throttled"] - before.get("nr_throttled", 0)) / max(periods, 1)

    def close(self, timeout: float = 10.0) -> None:
        """Remove the group once its processes are gone (killed by the deployment's exit)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
