"""The machine as this process may use it: memory and CPUs from the container's cgroup limits where they exist, else the host's.

Why: a hosted app (a Docker Space, a school server's container) sees the host's memory and cores
in /proc and psutil, not its own quota. Loading a pair that fits the host but not the quota gets
the process killed; running torch with one thread per host core on a 2-CPU quota gets every
thread throttled in turn. cgroup v2 (`memory.max`, `cpu.max`) and v1 (`memory.limit_in_bytes`,
`cpu.cfs_quota_us`) are both read, at the process's own cgroup path and every folder above it
(a parent's limit binds too), and the smallest limit wins.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specviz.host")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_UNLIMITED = 1 << 60  # v1 writes "no limit" as a huge number (9223372036854771712); anything above this is none
THREADS_ENV = "SPECVIZ_THREADS"  # the operator's own thread count, above anything read here


@dataclass(frozen=True)
class Limits:
    """What this process may use: the host's figures capped by its cgroup's."""

    memory_total: int  # bytes in all (the cgroup's memory limit, or the host's RAM, the smaller)
    memory_available: int  # bytes it may still take without being killed or swapping
    cpus: float  # CPUs it may keep busy (the cgroup's quota, or the CPUs it may run on, the smaller)
    memory_source: str  # "cgroup v2", "cgroup v1" or "host": where memory_total came from
    cpu_source: str  # the same for cpus

    def describe(self) -> str:
        """One line for logs and the README's hosting check."""
        return (f"{self.memory_total / (1 << 30):.1f} GB in all ({self.memory_source}), "
                f"{self.memory_available / (1 << 30):.1f} GB free, {self.cpus:g} CPUs ({self.cpu_source})")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _own_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller -> this process's cgroup path ("" for the v2 unified line), from /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            found[c] = path
    return found


def _folders(mount: Path, path: str | None) -> list[Path]:
    """The cgroup folder of `path` under `mount` and every folder above it, up to the mount itself."""
    folders = [mount]
    if path and path != "/":
        rel = Path(path.lstrip("/"))
        folders += [mount / p for p in [rel, *rel.parents] if str(p) != "."]
    return [f for f in dict.fromkeys(folders) if f.is_dir()]


def _memory(folders: list[Path], limit_file: str, used_file: str, inactive: tuple[str, ...]) -> tuple[int, int] | None:
    """(limit, in use less reclaimable file cache) of the tightest memory limit among `folders`, or None without one."""
    best: tuple[int, int] | None = None
    for folder in folders:
        limit = _int(_read(folder / limit_file))  # v2's "max" reads as None: no limit here
        if limit is None or limit >= _UNLIMITED:
            continue
        used = _int(_read(folder / used_file)) or 0
        used -= next((n for key in inactive if (n := _stat(folder / "memory.stat", key))), 0)
        if best is None or limit - used < best[0] - best[1]:
            best = (limit, max(0, used))
    return best


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value) or 0
    return 0


def _v2_cpus(root: Path, path: str | None) -> float | None:
    quotas = []
    for folder in _folders(root, path):
        quota, _, period = (_read(folder / "cpu.max") or "max").partition(" ")
        if quota != "max" and _int(quota) and _int(period):
            quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def _v1_cpus(root: Path, path: str | None) -> float | None:
    quotas = []
    for mount in (root / "cpu", root / "cpu,cpuacct"):
        for folder in _folders(mount, path):
            quota, period = _int(_read(folder / "cpu.cfs_quota_us")), _int(_read(folder / "cpu.cfs_period_us"))
            if quota and quota > 0 and period:
                quotas.append(quota / period)
    return min(quotas) if quotas else None


def _host_memory() -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def _host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def read_limits(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP, host_memory: tuple[int, int] | None = None,
                host_cpus: int | None = None) -> Limits:
    """The host's memory and CPUs, each capped by the process's cgroup limits (v2 first, then v1) where set."""
    total, available = host_memory or _host_memory()
    cpus = float(host_cpus or _host_cpus())
    paths = _own_paths(proc_cgroup)
    memory_source = cpu_source = "host"
    v2 = (root / "cgroup.controllers").is_file()  # the unified hierarchy is mounted at the root
    memory = (_memory(_folders(root, paths.get("")), "memory.max", "memory.current", ("inactive_file",)) if v2 else
              _memory(_folders(root / "memory", paths.get("memory")), "memory.limit_in_bytes", "memory.usage_in_bytes",
                      ("total_inactive_file", "inactive_file")))
    if memory is not None and memory[0] < total:
        limit, used = memory
        total, available = limit, min(available, max(0, limit - used))
        memory_source = "cgroup v2" if v2 else "cgroup v1"
    quota = _v2_cpus(root, paths.get("")) if v2 else _v1_cpus(root, paths.get("cpu") or paths.get("cpuacct"))
    if quota is not None and quota < cpus:
        cpus, cpu_source = quota, "cgroup v2" if v2 else "cgroup v1"
    return Limits(total, available, round(cpus, 2), memory_source, cpu_source)


def thread_count(limits: Limits, environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Threads for torch: the operator's SPECVIZ_THREADS, else OMP_NUM_THREADS, else the CPUs this process may use (rounded up)."""
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        value = _int(environ.get(name))
        if value and value > 0:
            return value
    # rounded up: on a 1.5-CPU quota two threads still do 1.5 CPUs of work between throttles, one does 1
    return max(1, math.ceil(limits.cpus - 1e-9))


_configured: list[int] = []  # the count set in this process, once


def configure_threads(limits: Limits | None = None) -> int:
    """Set torch's thread count to fit the container, once per process (Streamlit reruns its script often); the count."""
    if _configured and limits is None:
        return _configured[0]
    import torch

    limits = limits or read_limits()
    n = thread_count(limits)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    log.info("machine: %s; torch threads %d", limits.describe(), n)
    _configured[:] = [n]
    return n
