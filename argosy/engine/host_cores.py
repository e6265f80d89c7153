"""How many cores this process may use: its CPU affinity, bounded by its cgroup's CPU quota.

torch (OpenMP) sizes its thread pool by the affinity alone, so a container limited to 2 CPUs on a
64-core host would run 64 kernel threads that take turns on 2 cores' worth of time. No torch here:
the fleet controller imports it to share a node's cores among the replicas it starts.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores(proc_self: str = "/proc/self", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may run on, at most the smallest cgroup v2 `cpu.max` quota on its path
    (rounded up: a quota of 1.5 CPUs keeps two threads busy), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(proc_self, cgroup_root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_cpu_quota(proc_self: str = "/proc/self", cgroup_root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time the process's cgroup and its ancestors allow, the smallest; None: no limit.
    cgroup v2 (`cpu.max`: "QUOTA PERIOD" or "max PERIOD") or v1 (`cpu.cfs_quota_us`, -1 for none)."""
    try:
        lines = Path(proc_self, "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: "0::/a/b"
            limits += _quotas(Path(cgroup_root), path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/a/b", mounted at cpu,cpuacct or cpu
            for mount in (controllers, "cpu"):
                if Path(cgroup_root, mount).is_dir():
                    limits += _quotas(Path(cgroup_root, mount), path, _v1_quota)
                    break
    return min(limits) if limits else None


def _quotas(root: Path, path: str, read) -> list[float]:
    """The quota of the cgroup at `path` under `root` and of each ancestor that sets one. In a container
    the cgroup namespace shows its own cgroup as the root, so the limit is read there."""
    out, here = [], Path(root, path.lstrip("/"))
    while True:
        try:
            quota = read(here)
        except (OSError, ValueError):
            quota = None
        if quota is not None:
            out.append(quota)
        if here == root or root not in here.parents:
            return out
        here = here.parent


def _v2_quota(folder: Path) -> float | None:
    quota, period = Path(folder, "cpu.max").read_text().split()[:2]
    return None if quota == "max" or int(period) <= 0 else int(quota) / int(period)


def _v1_quota(folder: Path) -> float | None:
    quota = int(Path(folder, "cpu.cfs_quota_us").read_text())
    period = int(Path(folder, "cpu.cfs_period_us").read_text())
    return None if quota <= 0 or period <= 0 else quota / period
