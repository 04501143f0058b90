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
