"""The container's limits, read from cgroup files laid out as v2 and v1 mount them (fake trees on disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specviz import host
from specviz.models import fit

GIB = 1 << 30
HOST = (64 * GIB, 60 * GIB)  # a big host: 64 GB, 60 free


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _v2(tmp_path: Path, own: str, files: dict[str, str]) -> host.Limits:
    _write(tmp_path / "cg", {"cgroup.controllers": "cpu memory", **files})
    _write(tmp_path, {"proc": f"0::{own}\n"})
    return host.read_limits(tmp_path / "cg", tmp_path / "proc", HOST, 16)


def test_v2_limits_of_a_docker_container(tmp_path: Path) -> None:
    # inside a container the process sits at the namespace's root: "0::/" and the limits at the mount
    got = _v2(tmp_path, "/", {"memory.max": str(16 * GIB), "memory.current": str(5 * GIB),
                              "memory.stat": f"anon 1\ninactive_file {1 * GIB}\n", "cpu.max": "200000 100000"})
    assert (got.memory_total, got.memory_available) == (16 * GIB, 12 * GIB)  # the file cache it can drop is free
    assert (got.cpus, got.memory_source, got.cpu_source) == (2.0, "cgroup v2", "cgroup v2")
    assert host.thread_count(got, {}) == 2


def test_v2_a_parent_folders_limit_binds_and_max_means_none(tmp_path: Path) -> None:
    got = _v2(tmp_path, "/school/specviz", {
        "school/memory.max": str(8 * GIB), "school/cpu.max": "150000 100000",
        "school/specviz/memory.max": "max", "school/specviz/cpu.max": "max 100000",
    })
    assert got.memory_total == 8 * GIB and got.memory_available == 8 * GIB
    assert got.cpus == 1.5
    assert host.thread_count(got, {}) == 2  # rounded up: two threads do 1.5 CPUs of work between throttles


def test_no_limits_is_the_host(tmp_path: Path) -> None:
    got = _v2(tmp_path, "/", {"memory.max": "max", "cpu.max": "max 100000"})
    assert (got.memory_total, got.memory_available, got.cpus) == (*HOST, 16.0)
    assert (got.memory_source, got.cpu_source) == ("host", "host")
    assert host.thread_count(got, {}) == 16


def test_v1_hybrid_layout_like_this_machines(tmp_path: Path) -> None:
    # v1 controllers in their own folders, the process's memory cgroup nested (as /proc/self/cgroup says here)
    unlimited = "9223372036854771712"
    _write(tmp_path / "cg", {
        "memory/memory.limit_in_bytes": unlimited,
        "memory/box/42/memory.limit_in_bytes": str(4 * GIB),
        "memory/box/42/memory.usage_in_bytes": str(3 * GIB),
        "memory/box/42/memory.stat": f"cache 5\ntotal_inactive_file {1 * GIB}\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000",
    })
    _write(tmp_path, {"proc": "4:memory:/box/42\n3:cpu,cpuacct:/\n0::/\n"})
    got = host.read_limits(tmp_path / "cg", tmp_path / "proc", HOST, 16)
    assert (got.memory_total, got.memory_available) == (4 * GIB, 2 * GIB)
    assert (got.cpus, got.memory_source, got.cpu_source) == (0.5, "cgroup v1", "cgroup v1")
    assert host.thread_count(got, {}) == 1


def test_the_operators_thread_count_wins() -> None:
    limits = host.Limits(GIB, GIB, 2.0, "host", "host")
    assert host.thread_count(limits, {"SPECVIZ_THREADS": "3", "OMP_NUM_THREADS": "5"}) == 3
    assert host.thread_count(limits, {"OMP_NUM_THREADS": "5"}) == 5
    assert host.thread_count(limits, {"SPECVIZ_THREADS": "zero"}) == 2  # nonsense is ignored


def test_the_start_pair_fits_the_container_not_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 GB container on a 64 GB host starts on the light pair and refuses the default pair before loading it."""
    limited = _v2(tmp_path, "/", {"memory.max": str(4 * GIB), "memory.current": str(GIB // 2)})
    monkeypatch.setattr(host, "read_limits", lambda *a, **k: limited)
    start = fit.start_pair("qwen-coder", precision="fp16w")
    assert start.pair == fit.LIGHT_PAIR and "4.0 GB in all" in (start.note or "")
    with pytest.raises(fit.DoesNotFit, match="3.5 GB free"):
        fit.check_fit("qwen-coder", precision="fp16w")
    assert fit.check_fit("smollm2-135m") is not None  # 1.5 GB fits in what is left


@pytest.mark.parametrize(("cpuinfo", "cpus", "words"), [
    ("model name\t: AMD EPYC 7B13 64-Core Processor\n", 2.0, "2 CPU cores (AMD EPYC 7B13)"),
    ("model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n", 1.0, "1 CPU core (Intel Xeon)"),
    ("processor\t: 0\n", 1.5, "1.5 CPU cores"),  # an ARM board names no model
])
def test_the_pages_say_what_machine_they_measured_on(tmp_path: Path, cpuinfo: str, cpus: float, words: str) -> None:
    _write(tmp_path, {"cpuinfo": cpuinfo})
    said = host.machine_words(host.Limits(GIB, GIB, cpus, "host", "host"), tmp_path / "cpuinfo")
    assert said.startswith(words + ", ") and said.endswith(("no GPU", ")"))


# ------------------------------------------------------------------------------------------
# Others' CPU, from recorded /proc/stat texts and samples (no clock is read)
# ------------------------------------------------------------------------------------------

# this 2-core machine's /proc/stat, recorded (intr, ctxt and the rest cut short)
STAT_2 = """cpu  8395 0 4312 24129 464 0 96 28 0 0
cpu0 932 0 807 16805 137 0 7 10 0 0
cpu1 7462 0 3504 7323 326 0 88 18 0 0
intr 230005 0 0 0
ctxt 358608
btime 1717400000
processes 5806
"""
# a 4-core host whose second core runs a hog: user 900 of its 1000 ticks since the first sample
STAT_4 = """cpu  4000 0 400 5600 0 0 0 0 0 0
cpu0 100 0 100 800 0 0 0 0 0 0
cpu1 3700 0 100 200 0 0 0 0 0 0
cpu2 100 0 100 4300 0 0 0 0 0 0
cpu3 100 0 100 300 0 0 0 0 0 0
"""


def test_busy_seconds_from_a_recorded_proc_stat() -> None:
    # user + nice + system + irq + softirq + steal of each core; idle and iowait are not busy
    busy, cpus = host.busy_seconds(STAT_2, 100)
    assert cpus == 2 and busy == pytest.approx((932 + 807 + 7 + 10 + 7462 + 3504 + 88 + 18) / 100)
    assert host.busy_seconds(STAT_4, 100, {1, 3}) == (pytest.approx((3800 + 200) / 100), 2)  # only the cores it may use
    assert host.busy_seconds("cpu0 10 0 5 100\n", 100) == (pytest.approx(0.15), 1)  # an old kernel's four columns
    assert host.busy_seconds("intr 1 2\n\nctxt 3\n", 100) is None  # no core named
    assert host.busy_seconds(STAT_2, 100, {7}) is None


def _sample(busy: float, own: float, wall: float, cpus: int = 2) -> host.CpuSample:
    return host.CpuSample(busy, own, wall, cpus)


def test_others_cores_are_the_busy_time_less_this_processs_own() -> None:
    before = _sample(100.0, 5.0, 1000.0)
    hog = _sample(100.0 + 20 * (1.0 + 0.9), 5.0 + 20 * 0.9, 1020.0)  # 20 s: a hog on one core, the run on 0.9 of the other
    assert host.others_cores(before, hog) == pytest.approx(1.0)
    quiet = _sample(100.0 + 20 * 1.95, 5.0 + 20 * 1.9, 1020.0)  # a classroom's runs are this process's own: not others
    assert host.others_cores(before, quiet) == pytest.approx(0.05)
    ticks = _sample(100.0 + 19.99, 5.0 + 20.0, 1020.0)  # /proc/stat counts by ticks, the process's clock exactly
    assert host.others_cores(before, ticks) == 0.0
    assert host.others_cores(before, _sample(100.02, 5.0, 1000.5)) is None  # half a second: a tick reads as 0.02 cores
    assert host.others_cores(before, _sample(140.0, 5.0, 1020.0, cpus=3)) is None  # counted over other cores


def test_a_cpu_sample_needs_proc_stat_and_no_quota_below_its_cores(tmp_path: Path) -> None:
    import os

    mine = sorted(os.sched_getaffinity(0))
    _write(tmp_path, {"stat": "".join(f"cpu{i} 100 0 50 1000 0 0 0 0 0 0\n" for i in mine), "proc": "0::/\n"})
    _write(tmp_path / "cg", {"cgroup.controllers": "cpu memory", "cpu.max": "max 100000"})
    got = host.cpu_sample(tmp_path / "stat", tmp_path / "cg", tmp_path / "proc")
    assert got is not None and got.cpus == len(mine)
    assert got.busy_s == pytest.approx(len(mine) * 150 / os.sysconf("SC_CLK_TCK"))
    assert host.cpu_sample(tmp_path / "no-stat", tmp_path / "cg", tmp_path / "proc") is None  # not Linux
    # a container's quota below the cores /proc/stat counts: their busy time is mostly other tenants' work
    _write(tmp_path / "cg", {"cpu.max": f"{50000 * len(mine)} 100000"})
    assert host.cpu_sample(tmp_path / "stat", tmp_path / "cg", tmp_path / "proc") is None
