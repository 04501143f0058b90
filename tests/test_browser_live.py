"""What a teacher sees on a 2-core machine, played live: the default pair in the app and one Chromium page, nothing else.

Five cases a teacher played (D1 eagle Code, D5 eagle Code, D5 model Code, D1 hybrid Story, D5 eagle-tree List) are
played live, each from Play to its result, while the other pytest worker runs nothing (`quiet`: see tests/conftest.py):
none may be flagged busy, every caption must say what the run's downloaded trace says, and no metric may be cut off at
1280 px or at 390 px. Then a CPU hog on one core: the same page must flag the run. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from specviz.lessons import speed_words
from tests.test_browser import ARTIFACTS, CHROMIUM, PAGE_TEXT, PLAY, _chromium_page, _no_exception, streamlit_app

pytestmark = [pytest.mark.browser, pytest.mark.real, pytest.mark.slow, pytest.mark.default_pair, pytest.mark.quiet]
playwright = pytest.importorskip("playwright.sync_api")

CASES = (("d1", "eagle", "code"), ("d5", "eagle", "code"), ("d5", "model", "code"), ("d1", "hybrid", "story"),
         ("d5", "eagle-tree", "list"))
BUSY = ("uncertain: busy", "The machine was busy while these runs were timed",
        "The computer was busy with something else while we timed it")
CASE_MS = 600_000  # a case's own ceiling (loading the pair is the first case's): a hung page fails, a slow one does not

# every metric value and delta whose text does not fit its box (Streamlit cuts it with an ellipsis)
CUT_METRIC_VALUES = """() => [...document.querySelectorAll('[data-testid="stMetricValue"], [data-testid="stMetricDelta"]')]
  .flatMap(m => [m, ...m.querySelectorAll('*')])
  .filter(e => e.scrollWidth > e.clientWidth + 1 && e.clientWidth > 0).map(e => e.innerText)"""


@pytest.fixture(scope="module")
def app():
    """The app on its default pair (the server's own: no pair in the links), started here and always stopped."""
    import os

    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.time()
    with streamlit_app(sys.executable, ARTIFACTS / "streamlit-live-test.log", health_timeout=300) as url:
        _load_the_pair(url)
        yield url, started


def _load_the_pair(url: str) -> None:
    """Open a page until the server has loaded its pair, before a test here takes the machine: on an empty cache that
    builds the pair's cache (minutes), and the other worker's tests may run meanwhile (nothing is timed yet)."""
    from playwright.sync_api import expect

    with _chromium_page(900, CASE_MS, width=1280) as page:
        page.goto(f"{url}/?level=d1")
        expect(page.get_by_text(re.compile(r"Ready: \d+ prompt tokens"))).to_be_visible()


def _metrics(text: str) -> dict[str, tuple[str, str]]:
    """{label: (value, delta)} of the page's metrics, from PAGE_TEXT's "metric: label = value (delta)" lines."""
    found = {}
    for m in re.finditer(r"^metric: (.*?) = (.*?) \((.*)\)$", text, re.M):
        found[m.group(1)] = (m.group(2), m.group(3))
    return found


def _trace(page) -> dict:
    """The run's trace as the page offers it for download (the JSON button)."""
    with page.expect_download() as got:
        page.get_by_role("button", name=re.compile("Download trace \\(JSON\\)")).click()
    return json.loads(open(got.value.path(), encoding="utf-8").read())


def _true_to_trace(text: str, trace: dict, level: str) -> None:
    """Every figure the page states about the run is the trace's: tokens, big-model calls, acceptance, speed-up, c."""
    summary, spec = trace["summary"], trace["speculative"]
    tokens, calls, speedup = len(spec["tokens"]), spec["target_calls"], summary["speedup"]
    assert speedup is not None, "the downloaded trace has no speed-up: the baseline was not in it"
    if level == "d1":
        assert re.search(rf"\b{tokens} [\w ]+? written in {calls} big-model turns", text), text
        assert re.search(rf"Finished: {tokens} [\w ]+? in {calls} big-model turns", text), text
        assert f"With the helper it was {speed_words(speedup)}" in text, (speedup, text)
        return
    metrics = _metrics(text)
    assert metrics["speed-up"][0] == f"{speedup:.2f}×", (metrics, speedup)
    assert metrics["tokens / target call"][0] == f"{summary['tokens_per_target_call']:.2f}", metrics
    assert metrics["acceptance"][0] == f"{summary['acceptance_drafted']:.0%}", metrics
    assert metrics["c (draft ÷ target step)"][0] == f"{summary['c']:.3f}", metrics
    assert f"Run complete: {tokens} tokens in {calls} target calls" in text
    if summary["expected_speedup"] is not None:
        assert metrics["expected (Leviathan)"][0] == f"{summary['expected_speedup']:.2f}×", metrics
    else:  # a tree: its pass cost, not the chain formula
        assert metrics["tree pass (steps)"][0] == f"{summary['verify_steps']:.2f}", metrics
    together = "only with each other" in text or "runs** at once" in text or "a big-model pass of its own" in text
    reused = "for the same prompt and settings" in text
    assert together != reused, "the page says how the plain run was timed, once"
    if summary["identical"]:
        assert "token-for-token identical to the target alone" in text


def _play_live(page, url: str, level: str, drafter: str, preset: str, query: str = "",
               shot: str | None = None) -> tuple[str, dict]:
    """Open the case, wait for the pair, press Play (live: the runs are computed now), wait for both, show the result;
    a screenshot of its live view (`shot`), then its text and its downloaded trace."""
    from playwright.sync_api import expect

    t0 = time.time()
    page.goto(f"{url}/?level={level}&drafter={drafter}&preset={preset}{query}")
    expect(page.get_by_text(re.compile(r"Ready: \d+ prompt tokens"))).to_be_visible()
    _no_exception(page)
    ready = time.time()
    page.get_by_role("button", name=PLAY).click()
    expect(page.get_by_role("button", name=re.compile("Start the race"))).to_be_visible()  # both runs measured
    print(f"  {level} {drafter} {preset}: ready after {ready - t0:.0f} s, both runs measured {time.time() - ready:.0f} s "
          "after Play")  # shown, never asserted
    show = page.get_by_role("button", name=re.compile("Show the result now"))
    assert show.is_enabled()  # drawn for this run, in the same redraw as the race (it once waited for the replay's end)
    show.click()
    page.wait_for_timeout(2500)
    _no_exception(page)
    if shot:
        page.locator(".st-key-sv-live").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"{shot}.png"))
    return page.evaluate(PAGE_TEXT), _trace(page)


def test_five_cases_played_live_are_never_flagged_busy_and_every_caption_is_the_traces(app):
    url, started = app
    with _chromium_page(900, CASE_MS, width=1280) as page:
        for i, (level, drafter, preset) in enumerate(CASES):
            t0 = time.time()
            name = f"live-{i + 1}-{level}-{drafter}-{preset}"
            text, trace = _play_live(page, url, level, drafter, preset, shot=name)
            if i == 0:
                print(f"pair loaded and first case done {time.time() - started:.0f} s after the server started")
            print(f"{level} {drafter} {preset}: {time.time() - t0:.0f} s from opening to the result; speed-up "
                  f"{trace['summary']['speedup']:.2f}x")  # shown, never asserted
            (ARTIFACTS / f"{name}.txt").write_text(text, encoding="utf-8")
            (ARTIFACTS / f"{name}.json").write_text(json.dumps(trace), encoding="utf-8")
            assert not [w for w in BUSY if w in text], f"{name}: flagged busy with nothing else running"
            _true_to_trace(text, trace, level)
            assert page.evaluate(CUT_METRIC_VALUES) == [], name
        page.set_viewport_size({"width": 390, "height": 844})  # a phone: the last case's metrics, one under another
        page.wait_for_timeout(2000)
        assert page.evaluate(CUT_METRIC_VALUES) == []
        page.locator('[data-testid="stMetric"]').first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "live-phone.png"))


def test_a_hog_on_one_core_is_flagged(app):
    """A real program keeping one of the two cores busy while the runs are timed: the page says so, and gives no verdict."""
    url, _ = app
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with _chromium_page(900, CASE_MS, width=1280) as page:
            # another length than the cases': a fresh run and plain twin, timed now (the cases' would be reused)
            text, _ = _play_live(page, url, "d5", "model", "code", "&max_new=48", shot="live-hog")
    finally:
        hog.kill()
        hog.wait()
    assert "uncertain: busy" in text and "The machine was busy while these runs were timed" in text, text
