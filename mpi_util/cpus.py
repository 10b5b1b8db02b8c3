"""The CPUs this process was given: its affinity (taskset, a scheduler's binding) and its cgroup's CPU quota (a
container's or a Slurm job's limit), not the machine's cores that ``os.cpu_count()`` reports."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpus_available() -> int:
    """How many CPUs this process can use at once: the CPUs its affinity allows, capped by the CPU quota of its
    cgroup and every cgroup above it (rounded up: a quota of 1.5 CPUs keeps 2 threads busy part time). Not a
    collective.

    Returns:
        The number of CPUs, at least 1.
    """
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(allowed, math.ceil(quota)) if quota is not None else allowed)


def cgroup_cpu_quota() -> float | None:
    """The tightest CPU quota, in CPUs, on this process's cgroup and its ancestors (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None where no quota is set or none can be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy (under "unified" on a hybrid v1 / v2 machine)
            mount = _CGROUP_ROOT / "unified" if (_CGROUP_ROOT / "unified").is_dir() else _CGROUP_ROOT
            limits += _limits_up_from(mount, path, lambda d: parse_cpu_max(_read(d / "cpu.max")))
        elif "cpu" in controllers.split(","):  # cgroup v1: the hierarchy that has the cpu controller
            mount = next((m for m in (_CGROUP_ROOT / controllers, _CGROUP_ROOT / "cpu", _CGROUP_ROOT / "cpu,cpuacct")
                          if m.is_dir()), None)
            if mount is not None:
                limits += _limits_up_from(mount, path, lambda d: parse_cfs_quota(_read(d / "cpu.cfs_quota_us"),
                                                                                 _read(d / "cpu.cfs_period_us")))
    return min(limits) if limits else None


def _limits_up_from(mount: Path, cgroup_path: str, limit_of: Callable[[Path], float | None]) -> list[float]:
    """The quotas set on ``cgroup_path`` under ``mount`` and on each directory above it, up to the mount itself (in
    a container the mount's root is the container's own cgroup)."""
    found = []
    directory = mount / cgroup_path.lstrip("/")
    while True:
        limit = limit_of(directory) if directory.is_dir() else None
        if limit is not None:
            found.append(limit)
        if directory == mount or mount not in directory.parents:
            return found
        directory = directory.parent


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_cpu_max(text: str | None) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` ("QUOTA PERIOD" in microseconds, or "max PERIOD"); None for no limit.

    >>> parse_cpu_max("150000 100000")
    1.5
    """
    if not text:
        return None
    words = text.split()
    if len(words) != 2 or words[0] == "max":
        return None
    quota, period = float(words[0]), float(words[1])
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str | None, period_text: str | None) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` (quota -1: no limit); None for none."""
    if not quota_text or not period_text:
        return None
    quota, period = float(quota_text), float(period_text)
    return quota / period if quota > 0 and period > 0 else None
