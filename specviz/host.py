"""The machine as this process may use it: memory and CPUs from the container's cgroup limits where they exist, else the host's.

Why: a hosted app (a Docker Space, a school server's container) sees the host's memory and cores
in /proc and psutil, not its own quota. Loading a pair that fits the host but not the quota gets
the process killed; running torch with one thread per host core on a 2-CPU quota gets every
thread throttled in turn. cgroup v2 (`memory.max`, `cpu.max`) and v1 (`memory.limit_in_bytes`,
`cpu.cfs_quota_us`) are both read, at the process's own cgroup path and every folder above it
(a parent's limit binds too), and the smallest limit wins.

Others' CPU: a steady hog on one of two cores slows a run and its baseline alike and evenly, so their
step times do not show it. /proc/stat counts every process's CPU time; less this process's own (all its
threads: in a classroom, other pupils' runs too) it leaves what other programs took meanwhile.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specviz.host")

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STAT = Path("/proc/stat")
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


def _cpu_quota(root: Path, paths: dict[str, str]) -> float | None:
    """The tightest CPU quota of this process's cgroup (v2 where mounted, else v1), or None without one."""
    if (root / "cgroup.controllers").is_file():
        return _v2_cpus(root, paths.get(""))
    return _v1_cpus(root, paths.get("cpu") or paths.get("cpuacct"))


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
    quota = _cpu_quota(root, paths)
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


def machine_words(limits: Limits | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine for the pages' "measured here" lines, e.g. "2 CPU cores (AMD EPYC 7B13), no GPU"."""
    import torch  # already loaded by the runs the line is about; asked only whether they had a GPU

    cpus = (limits or read_limits()).cpus
    names = [line.partition(":")[2] for line in (_read(cpuinfo) or "").splitlines() if line.startswith("model name")]
    # "AMD EPYC 7B13 64-Core Processor", "Intel(R) Xeon(R) CPU @ 2.20GHz": the maker and model only
    model = " ".join(w for w in names[0].split("@")[0].replace("(R)", "").replace("(TM)", "").split()
                     if w not in ("CPU", "Processor") and not w.endswith("-Core")) if names else ""
    words = f"{cpus:g} CPU core{'' if cpus == 1 else 's'}" + (f" ({model})" if model else "")
    return words + (f", a GPU ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ", no GPU")


# ------------------------------------------------------------------------------------------
# Others' CPU: what other programs used of the CPUs this process runs on, between two samples
# ------------------------------------------------------------------------------------------

# /proc/stat's columns after "cpuN": user nice system idle iowait irq softirq steal guest guest_nice. Busy is all but
# idle and iowait (waiting for a disk is idle); guest time is already inside user, so it is not added twice.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
# /proc/stat counts in clock ticks (10 ms a core): over a shorter window a single tick reads as a tenth of a core
SHORTEST_WINDOW_S = 1.0


@dataclass(frozen=True)
class CpuSample:
    """CPU time spent so far on the CPUs this process may run on, by every process and by this one, at one moment."""

    busy_s: float  # CPU seconds all processes have run on those CPUs since boot (/proc/stat)
    own_s: float  # CPU seconds this process has run, all its threads (a classroom's other runs included: not others)
    wall_s: float  # time.monotonic() at the moment
    cpus: int  # how many CPUs busy_s counts


def busy_seconds(stat_text: str, ticks_per_s: float, cpus: set[int] | None = None) -> tuple[float, int] | None:
    """(busy CPU seconds since boot, CPUs counted) from the text of /proc/stat, over `cpus` (all when None);
    None if it names none of them."""
    busy, counted = 0, 0
    for line in stat_text.splitlines():
        name, *fields = line.split() or [""]
        if not name.startswith("cpu") or not name[3:].isdigit() or (cpus is not None and int(name[3:]) not in cpus):
            continue  # the first "cpu" line sums all CPUs: the ones counted are summed here instead
        values = [_int(f) or 0 for f in fields]
        busy += sum(values[i] for i in _BUSY_COLUMNS if i < len(values))
        counted += 1
    return (busy / ticks_per_s, counted) if counted else None


def others_cores(before: CpuSample, after: CpuSample) -> float | None:
    """CPUs other processes kept busy on average between two samples: (busy - own) / wall; None over too short a window."""
    wall = after.wall_s - before.wall_s
    if wall < SHORTEST_WINDOW_S or after.cpus != before.cpus:
        return None
    # never below 0: /proc/stat samples this process's time by ticks, its own clock counts exactly
    return max(0.0, ((after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / wall)


def cpu_sample(proc_stat: Path = PROC_STAT, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> CpuSample | None:
    """The CPU time spent so far on this process's CPUs, by all and by itself; None where it cannot be told (no
    /proc/stat: not Linux; or a CPU quota below those CPUs: a container on a bigger host, whose busy time is mostly
    other tenants' work on cores it does not own)."""
    text = _read(proc_stat)
    if text is None:
        return None
    cpus = _affinity()
    busy = busy_seconds(text, os.sysconf("SC_CLK_TCK"), cpus)
    if busy is None:
        return None
    quota = _cpu_quota(root, _own_paths(proc_cgroup))
    if quota is not None and quota < busy[1]:
        return None
    return CpuSample(busy[0], time.process_time(), time.monotonic(), busy[1])


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return None
