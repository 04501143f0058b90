"""Shared pytest set-up: markers, small fixtures, and how tests run two at a time (tests/run.sh starts two workers)."""

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

DEFAULT_PAIR_GROUP = "default-pair"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "real: uses real packaged model weights (slower)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds even when cached")
    config.addinivalue_line("markers", "browser: drives Debian's chromium through Playwright")
    config.addinivalue_line("markers", "default_pair: loads the default pair's weights outside the `qwen_pair` fixture "
                                       "(in this process or a child); runs on the worker that holds that pair")
    config.addinivalue_line("markers", "quiet: times real runs and judges whether the machine was busy: runs while the "
                                       "other worker runs nothing (see pytest_runtest_call)")
    config.addinivalue_line("markers", "first_start: measures the default pair's first start, which builds the suite's "
                                       "cache when it holds nothing of the pair: handed out first on its worker")


def _holds_default_pair(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "qwen_pair" in names or "qwen_fp16w_pair" in names or item.get_closest_marker("default_pair") is not None


def _is_long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ("slow", "browser"))


def _module_of(item: pytest.Item) -> str:
    return getattr(getattr(item, "module", None), "__name__", item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With two workers (`--dist loadgroup`): every test that holds the default pair runs on one worker, one at a time.

    Each worker is its own process: two holding the 4.4 GB pair, or one loading its 10.7 GB bf16 form while the other
    holds it, would leave a 24 GB machine too little memory (the pair's own fit check refuses to load then). Every
    other test goes with its module, so a module's fixtures (a Streamlit server, SmolLM2) start once. The default
    pair's group is handed out first and modules with long tests next, so that no long group starts last. In the
    default pair's group the first-start measurement goes first: on an empty cache its start is the suite's one build
    of the pair (tests/test_models_half.py), where any other test first would build it and the measurement again."""
    if not config.getoption("loadgroup", default=False):
        return
    long_modules = {_module_of(item) for item in items if _is_long(item)}

    def handed_out(item: pytest.Item) -> tuple[int, int]:  # the default pair's group first, then modules with long tests
        if _holds_default_pair(item):
            return 0, 0 if item.get_closest_marker("first_start") else 1
        return (1 if _module_of(item) in long_modules else 2), 0

    items.sort(key=handed_out)  # stable: each group keeps its tests' order
    for item in items:
        _join_group(item, DEFAULT_PAIR_GROUP if _holds_default_pair(item) else _module_of(item))


def _join_group(item: pytest.Item, group: str) -> None:
    """Put the test in an xdist group: the group's name after an "@" in its id, which is what the scheduler reads.

    pytest-xdist 3.8 does this for an `xdist_group` mark by writing `item._nodeid`, which pytest 9 no longer reads (a
    nodeid is a parsed `NodeId` there), so the mark alone groups nothing: both workers loaded the default pair."""
    node_id = getattr(item, "_id", None)
    if node_id is None or not hasattr(node_id, "parse"):  # an older pytest: xdist's own mark works there
        item.add_marker(pytest.mark.xdist_group(group))
        return
    grouped = type(node_id).parse(f"{item.nodeid}@{group}")
    assert str(grouped) == f"{item.nodeid}@{group}", grouped
    item._id = grouped


@pytest.fixture(scope="session")
def qwen_pair():
    """The default pair at its default precision (gguf on a CPU), loaded once for the whole run: tests only read it."""
    from specviz.models import load_pair

    return load_pair("qwen-coder")


@pytest.fixture(scope="session")
def qwen_fp16w_pair():
    """The default pair at fp16w (fp16 weights, fp32 arithmetic: the lessons' reference precision; its default is gguf),
    loaded once for the whole run: tests only read it."""
    from specviz.models import load_pair

    return load_pair("qwen-coder", target_precision="fp16w")


def _lock_file(name: str) -> Path:
    """A lock file the two workers of this run share (another run's are its own)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "solo")
    return Path(tempfile.gettempdir()) / f"specviz-tests-{os.getuid()}-{run}.{name}"


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, mode)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _two_workers() -> bool:
    return os.environ.get("PYTEST_XDIST_WORKER") is not None  # one process: nothing else runs beside a test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """With two workers, a test marked `quiet` is timed while the other worker runs nothing (pytest_runtest_call below).
    Every other test holds the machine shared for its whole protocol: setup, call and teardown, with the module and
    session fixtures set up or torn down there. (Held by a function fixture, it left them out: a quiet test was timed
    while the other worker loaded a module's pair, and the page rightly said the machine was busy.)"""
    if not _two_workers() or item.get_closest_marker("quiet"):
        return (yield)
    gate, machine = _lock_file("gate"), _lock_file("machine")
    with open(machine, "a") as held:
        with _flock(gate, fcntl.LOCK_SH):  # passes the gate unless a quiet test waits for the machine or holds it
            fcntl.flock(held, fcntl.LOCK_SH)
        try:
            return (yield)
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[object]:
    """A quiet test plays real runs live in Chromium and asserts that the page did not flag them busy: a suite test on
    the other core would rightly make it so. Its call takes the gate (no test starts while it waits or runs) and then the
    machine (it waits for the test running there to end, teardown included). Its setup holds nothing: loading the pair
    for it (minutes on an empty cache) is not timed, and the other worker's tests may run meanwhile."""
    if not _two_workers() or not item.get_closest_marker("quiet"):
        return (yield)
    with _flock(_lock_file("gate"), fcntl.LOCK_EX), _flock(_lock_file("machine"), fcntl.LOCK_EX):
        return (yield)
