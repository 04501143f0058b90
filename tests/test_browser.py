"""One real run in Debian's Chromium: the app on the smollm2-135m pair, driven like a teacher would."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PLAY = re.compile(r"^Play\b")  # the button's accessible name is "Play Shortcut K"
# SPECVIZ_README_SHOTS=1 SPECVIZ_BROWSER_PAIR=qwen-coder (under `flock /tmp/specviz-heavy.lock`) makes the README screenshots
# with the app's default pair; the default smollm2-135m pair keeps the test light.
PAIR = os.environ.get("SPECVIZ_BROWSER_PAIR", "smollm2-135m")
PROMPTS = {  # a prompt that reliably gives both accepted and rejected guesses with each pair
    "smollm2-135m": ("Once upon a time, in a village at the edge of a great forest, there lived", 40),
    "qwen-coder": ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', 64),
}
PROMPT, MAX_NEW = PROMPTS.get(PAIR, PROMPTS["smollm2-135m"])
RUN_TIMEOUT_MS = 300_000  # a shared 2-core CPU can be slow: loading, both runs and the replay

pytestmark = [pytest.mark.browser, pytest.mark.real, pytest.mark.slow]
playwright = pytest.importorskip("playwright.sync_api")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("streamlit did not become healthy")


@contextlib.contextmanager
def streamlit_app(python: str, log_path: Path, health_timeout: float = 90.0) -> Iterator[str]:
    """`python -m streamlit run app.py` on a free port, its output in `log_path`; its URL once healthy, always stopped."""
    port = _free_port()
    cmd = [python, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
           "--server.address", "127.0.0.1", "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(url, proc, health_timeout)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@pytest.fixture(scope="module")
def server():
    """`streamlit run app.py` from this venv on a free port, shared by this module's tests (each opens its own browser
    context, so its own session; a start and the pair's load cost several seconds a test); always stopped at the end,
    even on failure. A fresh server's deep links are the link test's (its own server)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_app(sys.executable, ARTIFACTS / "streamlit-browser-test.log") as url:
        yield url


README_SHOTS = os.environ.get("SPECVIZ_README_SHOTS") == "1"  # only then are the README's pictures replaced


def _readme_shot(name: str) -> Path:
    """Where a README picture is written: over the README's own only when asked (SPECVIZ_README_SHOTS=1), else in test-artifacts/."""
    return (ROOT / "assets" if README_SHOTS else ARTIFACTS) / name


def _shot(page, name: str, readme_copy: str | None = None) -> None:
    """A screenshot in test-artifacts/; copied over the README's picture only when asked (SPECVIZ_README_SHOTS=1)."""
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    if readme_copy and README_SHOTS:
        shutil.copyfile(path, ROOT / "assets" / readme_copy)
        _record_readme_shot(page, readme_copy)


# the page's words, then what innerText leaves out or runs together: each metric as "label = value (delta)" and
# each sidebar box's chosen entry (an <input>'s value is not text)
PAGE_TEXT = """() => [document.body.innerText,
  ...[...document.querySelectorAll('[data-testid="stMetric"]')].map(m => {
    const part = id => (m.querySelector(`[data-testid="${id}"]`)?.innerText || '').trim();
    return `metric: ${part('stMetricLabel')} = ${part('stMetricValue')} (${part('stMetricDelta')})`; }),
  ...[...document.querySelectorAll('[data-testid="stSidebar"] input[role="combobox"]')]
    .map(e => `box: ${e.getAttribute('aria-label')} = ${e.value}`)].join('\\n')"""


def _git(*args: str) -> str:
    """git's answer in this repository (read-only commands only)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def _record_readme_shot(page, name: str) -> None:
    """Write the record of a README picture just saved (SPECVIZ_README_SHOTS=1): its figures read from the page itself."""
    if not README_SHOTS:
        return
    from tests.test_readme_pictures import picture_record, save_record

    code_changed = _git("status", "--porcelain", "--", "app.py", "pages", "specviz", "assets/style.css") != ""
    text = page.evaluate(PAGE_TEXT)
    (ARTIFACTS / f"{name}.txt").write_text(text, encoding="utf-8")  # what the record was read from (why it was busy)
    save_record(picture_record(name, text, (ROOT / "assets" / name).read_bytes(),
                               _git("rev-parse", "HEAD"), code_changed, datetime.date.today().isoformat()))


def _wait_for_the_replay_end(page, seconds: int) -> None:
    """Wait (up to `seconds`) until the replay stops: the Pause button turns back into Play."""
    for _ in range(seconds):
        if page.get_by_role("button", name=PLAY).count():
            return
        page.wait_for_timeout(1000)


def _play(page) -> None:
    """Press Play. The page keeps still while the runs are timed (one progress line), then replays them."""
    page.get_by_role("button", name=PLAY).click()


def _no_exception(page) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()
    assert page.get_by_text("Page not found").count() == 0


# a sidebar choice box is an <input>: a long value is cut, not wrapped, so compare its text width with its box
CUT_SIDEBAR_BOXES = """() => [...document.querySelectorAll('[data-testid="stSidebar"] input[role="combobox"]')]
  .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.value)"""


# a metric label that does not fit its column: Streamlit ends it in "…" unless assets/style.css lets it wrap
CUT_METRIC_LABELS = """() => [...document.querySelectorAll('[data-testid="stMetricLabel"] .stMarkdownEllipsis')]
  .filter(e => e.scrollWidth > e.clientWidth + 1 || e.offsetHeight < e.scrollHeight - 1).map(e => e.textContent)"""


def test_a_teacher_runs_a_demo_in_chromium(server):
    from playwright.sync_api import expect

    with _chromium_page(2300, RUN_TIMEOUT_MS, width=1440) as page:
        page.goto(f"{server}/?pair={PAIR}&level=d5&gamma=4&max_new={MAX_NEW}&speed=fastest")

        expect(page.get_by_label("Model pair (draft → target)")).to_be_visible()
        assert page.evaluate(CUT_SIDEBAR_BOXES) == []  # the pair's whole name is in view
        prompt = page.get_by_label("Prompt (the models continue this text)")
        prompt.fill(PROMPT)
        prompt.press("Control+Enter")
        expect(page.get_by_text(re.compile(r"Ready: \d+ prompt tokens"))).to_be_visible()
        _no_exception(page)
        _play(page)

        # rounds stream in: at least three lanes, with accepted and rejected guesses among them
        expect(page.locator(".sv-lane").nth(2)).to_be_visible()
        expect(page.locator(".sv-acc").first).to_be_visible()
        expect(page.locator(".sv-rej").first).to_be_visible()
        # the race appears once both runs are measured; then jump the replay to the end
        expect(page.get_by_role("button", name=re.compile("Start the race"))).to_be_visible()
        _wait_for_the_replay_end(page, 60)
        speed = page.locator('[data-testid="stMetric"]').filter(has_text="speed-up")
        expect(speed.first).to_contain_text(re.compile(r"\d+\.\d\d×"))
        expect(page.get_by_text("Greedy check", exact=False)).to_be_visible()
        _no_exception(page)
        assert page.evaluate(CUT_METRIC_LABELS) == []  # D5's long labels ("expected (measured verify cost)") whole
        assert "<img" not in page.locator(".sv-text").first.inner_html()
        _shot(page, "watch-d5.png", "screenshot-d5.png")

        page.get_by_text("D1 · Story").click()
        expect(page.get_by_text("Watch the helper at work")).to_be_visible()
        expect(page.locator(".sv-lane").first).to_be_visible()
        page.wait_for_timeout(1500)
        _no_exception(page)
        _shot(page, "watch-d1.png", "screenshot-d1.png")

        # clicking the chosen token pill again keeps its p/q table (it used to empty it)
        page.get_by_text("D5 · Frontier").click()
        pills = page.get_by_role("radiogroup", name="Drafted tokens")
        for _ in range(12):  # the last round may have drafted nothing: step back (J) to one that did
            if pills.count():
                break
            page.keyboard.press("j")
            page.wait_for_timeout(1500)
        pills.get_by_role("radio", checked=True).click()
        page.wait_for_timeout(1500)
        expect(page.locator(".sv-rule")).to_have_count(1)
        expect(pills.get_by_role("radio", checked=True)).to_have_count(1)
        _no_exception(page)


def test_the_watch_page_plays_a_token_tree_in_chromium(server):
    """A tree run: every round drawn as a tree (accepted path, struck rejections, faded unreached), at D2."""
    from playwright.sync_api import expect

    with _chromium_page(2300, RUN_TIMEOUT_MS) as page:
        page.goto(f"{server}/?pair={PAIR}&level=d2&drafter=tree&max_new={MAX_NEW}&speed=fastest")
        prompt = page.get_by_label("Prompt (the models continue this text)")
        prompt.fill(PROMPT)
        prompt.press("Control+Enter")
        _play(page)
        expect(page.locator(".sv-tree").first).to_be_visible()
        expect(page.get_by_role("button", name=re.compile("Start the race"))).to_be_visible()
        _wait_for_the_replay_end(page, 60)
        page.wait_for_timeout(1500)
        _no_exception(page)
        trees = page.locator(".sv-tree")
        assert trees.count() >= 1 and trees.locator(".sv-acc").count() >= 1
        assert page.evaluate(CUT_METRIC_LABELS) == []  # "tokens / target call" whole at 1280 px
        expect(page.get_by_text("Greedy check", exact=False)).to_be_visible()
        _shot(page, "watch-tree.png")
        # the README shows the tree picture itself (the page scrolls inside its own container: a page shot stops short of it)
        trees.first.scroll_into_view_if_needed()
        trees.first.screenshot(path=str(_readme_shot("screenshot-tree.png")))
        _record_readme_shot(page, "screenshot-tree.png")


XSS_PROMPT = ('Say <img src=x onerror="window.__xss=1;alert(1)"> and <script>window.__xss=2;alert(2)</script> '
              "then **bold** $x^2$ [a](javascript:alert(3))")


def test_html_in_a_prompt_is_shown_as_text_and_never_runs(server):
    """A pupil pastes HTML, script, Markdown and LaTeX through a link: all shown as typed, nothing executed."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    with _chromium_page(1800, RUN_TIMEOUT_MS) as page:
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{server}/?pair=tiny-random&level=d2&max_new=12&speed=fastest&autoplay=1&prompt={quote(XSS_PROMPT)}")
        expect(page.get_by_text("Greedy check", exact=False)).to_be_visible()
        _wait_for_the_replay_end(page, 30)  # let the replay reach its end, so every token is on screen
        _no_exception(page)
        text = page.locator(".sv-text").first
        expect(text).to_contain_text('<img src=x onerror="window.__xss=1;alert(1)">')
        expect(text).to_contain_text("<script>window.__xss=2;alert(2)</script>")
        assert text.locator("img, script, strong, a").count() == 0
        page.wait_for_timeout(1000)
        assert dialogs == [] and page.evaluate("window.__xss") is None
        _shot(page, "xss-as-text.png")


# (path, the button a pupil presses, what must appear after it), each opened as a deep link (a fresh server's deep
# links: test_every_link_opens_its_page_without_a_dialog_in_chromium)
LAB_PAGES = (
    ("why_cheap", "Measure pass times", '[data-testid="stPlotlyChart"]'),  # no chart before a measurement
    ("same_answer", "Run both and compare", r"text=/Identical: \d+ of \d+ tokens/"),
    ("how_far", "Measure", r"text=/Target alone: \d+ ms per token/"),
    ("where_it_helps", "Run the workloads", "text=/workloads averaged/"),
)


def test_every_lab_page_runs_in_chromium(server):
    """Each lab page opens with the shared sidebar, runs its measurement on the tiny pair, and draws it."""
    from playwright.sync_api import expect

    with _chromium_page(1800, 180_000) as page:
        for path, button, result in LAB_PAGES:
            page.goto(f"{server}/{path}?pair=tiny-random&level=d2&max_new=24")
            expect(page.locator('[data-testid="stMain"] h1').first).to_be_visible()
            expect(page.get_by_text("Explanation level")).to_be_visible()
            page.get_by_role("button", name=re.compile("^" + re.escape(button))).first.click()
            expect(page.locator(result).first).to_be_visible()
            page.wait_for_timeout(1000)
            _no_exception(page)
            _shot(page, f"lab-{path}.png")


def test_the_busy_server_lab_answers_a_prediction_with_its_recording_in_chromium(server):
    """The batch lab at D5: predict, show the shipped recording, see its chart, table and words (no model is loaded)."""
    from playwright.sync_api import expect

    with _chromium_page(2600, 120_000, width=1440) as page:
        page.goto(f"{server}/why_cheap?level=d5")
        heading = page.get_by_role("heading", name="Busy servers: batches, measured")
        expect(heading).to_be_visible()
        page.get_by_text("A bit faster", exact=True).click()
        page.get_by_role("button", name=re.compile("Show the recorded measurement")).click()
        expect(page.get_by_text(re.compile(r"You predicted .A bit faster."))).to_be_visible()
        expect(page.get_by_text(re.compile("Speed-up of speculative decoding over plain decoding"))).to_be_visible()
        section = page.locator('[data-testid="stPlotlyChart"]').filter(has=page.locator("text=/runs sharing the big model/"))
        expect(section.first).to_be_visible()
        page.wait_for_timeout(1500)
        _no_exception(page)
        top = heading.bounding_box()["y"]
        end = page.get_by_text(re.compile("^Recorded with the same code")).bounding_box()
        page.screenshot(path=str(_readme_shot("screenshot-batch.png")), full_page=True,
                        clip={"x": 0, "y": top - 16, "width": 1440, "height": end["y"] + end["height"] - top + 32})
        _record_readme_shot(page, "screenshot-batch.png")


@contextlib.contextmanager
def _chromium_page(height: int, timeout_ms: int, width: int = 1280) -> Iterator[Any]:
    """One Chromium page (1280 px wide unless asked), with the timeouts set; the browser is always closed."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            expect.set_options(timeout=timeout_ms)
            yield page
        finally:
            browser.close()


def test_a_link_naming_server_folders_is_refused_in_chromium(server):
    """A shared link that asks the server to open its own folders gets one note; no path comes back, nothing loads."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    with _chromium_page(1400, 120_000) as page:
        # why_cheap loads no model until a button is pressed: the refused link alone is tested
        page.goto(f"{server}/why_cheap?pair={quote('hf:/etc,/root')}&autoplay=1")
        expect(page.get_by_text("This server runs only the model pairs its operator chose")).to_be_visible()
        expect(page.get_by_text("Explanation level")).to_be_visible()
        page.wait_for_timeout(1000)
        _no_exception(page)
        shown = page.locator("body").inner_text()
        assert "/etc" not in shown and "/root" not in shown and "hf:" not in shown
        _shot(page, "refused-link.png")


@pytest.fixture()
def tiny_server(monkeypatch):
    """A fresh server whose default pair is the tiny one, so a link without `pair` loads nothing heavy."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    ARTIFACTS.mkdir(exist_ok=True)
    monkeypatch.setenv("SPECVIZ_DEFAULT_PAIR", "tiny-random")
    with streamlit_app(sys.executable, ARTIFACTS / "streamlit-links-test.log") as url:
        yield url


# every page's own link and its heading on a fresh visit (D1); /watch first, as the deep link a fresh server meets
PAGE_LINKS = (
    ("/watch", "Watch the helper at work"),
    ("/", "Watch the helper at work"),
    ("/same_answer", "Does the helper change the answer?"),
    ("/how_far", "How far should the helper guess?"),
    ("/where_it_helps", "Where does the helper help?"),
    ("/why_cheap", "Why checking is quick"),
)


def _readme_link() -> str:
    """The README's example link, as a path and query (its host is the README's localhost:8501)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"http://localhost:8501(/[^\s)`]*\?[^\s)`]+)", text)
    assert found, "the README shows no example link with settings"
    return found.group(1)


def _opens(page, url: str, heading: str) -> None:
    """`url` opens its page: the heading shows and no "Page not found" dialog covers it."""
    from playwright.sync_api import expect

    page.goto(url)
    expect(page.get_by_role("heading", name=heading).first).to_be_visible()
    page.wait_for_timeout(1000)  # the not-found dialog comes with the page's first run: give it time to show
    assert page.get_by_role("dialog").count() == 0, page.get_by_role("dialog").first.inner_text()
    _no_exception(page)


def test_every_link_opens_its_page_without_a_dialog_in_chromium(tiny_server):
    """Each page's link, the README's example and a copied address bar open their page on a fresh server, with no
    "Page not found" dialog; on /watch the Play button takes a click (no dialog covers it)."""
    from playwright.sync_api import expect

    with _chromium_page(1400, 120_000) as page:
        for path, heading in PAGE_LINKS:
            _opens(page, tiny_server + path, heading)
        _opens(page, f"{tiny_server}/watch", "Watch the helper at work")
        expect(page.get_by_text(re.compile(r"Ready: \d+ prompt tokens"))).to_be_visible()
        page.get_by_role("button", name=PLAY).click(timeout=10_000)  # times out while anything covers the button
        expect(page.locator(".sv-lane").first).to_be_visible()

        _opens(page, tiny_server + _readme_link(), "Watch it work")  # level=d2 in the link
        expect(page.locator(".sv-lane").first).to_be_visible()  # autoplay=1 started the run
        # the address bar is the share link: change a setting, copy the address, open it afresh
        for path, heading in (("/watch", "Watch it work"), ("/how_far", "How far to guess")):
            _opens(page, f"{tiny_server}{path}?level=d2", heading)
            page.get_by_text("D5 · Frontier").click()
            expect(page).to_have_url(re.compile(re.escape(tiny_server + path) + r"\?(.*&)?level=d5\b"))
            _opens(page, page.url, heading)
            expect(page.get_by_role("radio", name="D5 · Frontier")).to_be_checked()
        _shot(page, "links.png")


WIDER_THAN_SCREEN = """() => [...document.querySelectorAll('[data-testid=stPlotlyChart], img, .sv-lane, table, .sv-text')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.className || e.tagName)"""


def test_a_phone_at_390_px_sees_the_page_and_the_newest_text(server):
    """On a 390 px phone: the sidebar starts closed, nothing is wider than the screen, and the text box shows its end."""
    from playwright.sync_api import expect

    with _chromium_page(5200, RUN_TIMEOUT_MS, width=390) as page:
        long_prompt = "".join(f"Line {i} of a long prompt.\n" for i in range(40)) + PROMPT  # ~1,000 tokens on a byte-level pair
        from urllib.parse import quote
        page.goto(f"{server}/?pair={PAIR}&max_new={MAX_NEW}&speed=fastest&prompt={quote(long_prompt)}")
        expect(page.get_by_text("Watch the helper at work")).to_be_visible()  # a fresh visit opens at D1
        sidebar = page.locator('[data-testid="stSidebar"]')
        assert sidebar.count() == 0 or sidebar.bounding_box() is None or sidebar.bounding_box()["x"] < 0 \
            or sidebar.get_attribute("aria-expanded") == "false"
        _play(page)
        expect(page.locator(".sv-lane").nth(2)).to_be_visible()
        expect(page.locator(".sv-fold")).to_have_count(1)  # the long prompt is folded to its last lines
        box = page.locator(".sv-text").first
        # the box is scrolled to its end: the caret (newest text) lies inside the box's visible area
        inside = box.evaluate("""b => { const c = b.querySelector('.sv-caret').getBoundingClientRect();
                                       const r = b.getBoundingClientRect(); return c.bottom <= r.bottom + 1 && c.top >= r.top - 1; }""")
        assert inside
        _wait_for_the_replay_end(page, 90)
        page.wait_for_timeout(1500)
        _no_exception(page)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.evaluate(WIDER_THAN_SCREEN) == []
        _shot(page, "watch-phone.png")
        # the README shows the part a pupil watches: from the rounds down through the text, one phone screen tall
        top = page.get_by_role("heading", name="Turn by turn").bounding_box()["y"]
        page.screenshot(path=str(_readme_shot("screenshot-phone.png")), clip={"x": 0, "y": top - 16, "width": 390, "height": 1500})
        _record_readme_shot(page, "screenshot-phone.png")



@pytest.fixture(params=[False, True], ids=["own-memory", "class-memory"])
def memory_server(request, monkeypatch):
    """A fresh tiny-pair server, with class-wide memory off (the default) or turned on by its operator."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium")
    ARTIFACTS.mkdir(exist_ok=True)
    monkeypatch.setenv("SPECVIZ_CLASS_MEMORY", "1" if request.param else "0")
    with streamlit_app(sys.executable, ARTIFACTS / f"streamlit-memory-{request.param}.log") as url:
        yield url, request.param


SECRET_PROMPT = "Ada's diary, page nine: the password to the old garden shed is tangerine walrus, and nobody knows it."
OTHER_PROMPT = "Ada's diary, page nine: the password to the old garden shed is"  # another pupil's text that ends alike


def _memory_run(browser, server: str, prompt: str) -> tuple[list[str], str]:
    """One pupil's own browser (a fresh context: its own cookies) plays `prompt` with the suffix drafter to the end;
    every round's drafted text from the trace it downloads, and everything its page shows."""
    from urllib.parse import quote

    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 1800})
    try:
        page = context.new_page()
        page.set_default_timeout(180_000)
        page.goto(f"{server}/?pair=tiny-random&level=d5&max_new=12&speed=fastest&drafter=suffix&autoplay=1"
                  f"&prompt={quote(prompt)}")
        button = page.get_by_role("button", name=re.compile("Download trace \\(JSON\\)"))
        expect(button).to_be_visible(timeout=180_000)
        _wait_for_the_replay_end(page, 60)
        _no_exception(page)
        with page.expect_download() as got:
            button.click()
        trace = json.loads(Path(got.value.path()).read_text(encoding="utf-8"))
        drafts = ["".join(r["draft_texts"]) for r in trace["speculative"]["rounds"]]
        return drafts, page.evaluate(PAGE_TEXT)
    finally:
        context.close()


def test_a_pupil_never_sees_another_pupils_text_in_drafts_unless_class_memory_is_on(memory_server):
    """Two browsers on one server: the second one's drafts hold the first one's prompt only when the operator turned
    class-wide memory on (and then the page says so)."""
    from playwright.sync_api import sync_playwright

    url, class_wide = memory_server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            _memory_run(browser, url, SECRET_PROMPT)
            drafts, shown = _memory_run(browser, url, OTHER_PROMPT)
        finally:
            browser.close()
    leaked = [d for d in drafts if "walrus" in d or "tangerine" in d]
    # the link's settings held while the run computed (a run_every fragment's rerun once dropped the sidebar's state)
    assert "settings changed since this run" not in shown
    assert ("Class-wide memory is on" in shown) == class_wide
    if class_wide:
        assert leaked, drafts  # the class's memory proposed how the first pupil's text went on
    else:
        assert not leaked and "walrus" not in shown and "tangerine" not in shown, leaked
