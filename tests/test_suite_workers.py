"""The suite's two workers (tests/run.sh): every test holding the default pair runs on one worker, each module on one."""

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def _workers_of(pytester: pytest.Pytester) -> dict[str, set[str]]:
    """Run the made tests on two workers as tests/run.sh does; {test name: the workers it ran on}."""
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                                           "--no-loadscope-reorder", "-v")
    result.assert_outcomes(passed=12)
    ran: dict[str, set[str]] = {}
    for line in result.outlines:
        found = re.match(r"\[(gw\d)\] .*PASSED (\S+)", line)
        if found:
            ran.setdefault(found.group(2), set()).add(found.group(1))
    return ran


def test_the_default_pairs_tests_share_one_worker_and_modules_stay_whole(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    holder = """
import pytest

@pytest.fixture(scope="session")
def qwen_pair():  # a stand-in: the group is chosen by the fixture's name
    return object()

def test_holds_{n}(qwen_pair):
    pass

@pytest.mark.default_pair
def test_marked_{n}():
    pass

def test_light_{n}_a():
    pass

def test_light_{n}_b():
    pass
"""
    pytester.makepyfile(**{f"test_m{n}": holder.format(n=n) for n in range(3)})
    ran = _workers_of(pytester)
    assert len(ran) == 12 and all(len(w) == 1 for w in ran.values())
    holding = {w for name, ws in ran.items() if re.search(r"::test_(holds|marked)_", name) for w in ws}
    assert len(holding) == 1  # six tests from three modules, one worker
    assert all(name.endswith("@default-pair") for name in ran if re.search(r"::test_(holds|marked)_", name))
    for n in range(3):
        light = {w for name, ws in ran.items() if f"::test_light_{n}_" in name for w in ws}
        assert len(light) == 1  # a module's other tests keep together
    assert len({w for ws in ran.values() for w in ws}) == 2  # and both workers were used
