"""The README's pictures are true: each is recorded in assets/screenshots.json, made with the default pair, not busy."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from specviz.models.registry import DEFAULT_PAIR, PAIR_NAMES, get_spec

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RECORDS = ROOT / "assets" / "screenshots.json"
ABOUT = ("One record per picture the README shows, written by tests/test_browser.py when SPECVIZ_README_SHOTS=1 from the "
         "page's own text in Chromium (null: the page did not show it); uncommitted_changes: app.py, pages/ or specviz/ "
         "differed from the commit. tests/test_readme_pictures.py checks each against the file on disk.")
# what the Watch page says when the timing was disturbed (D5's metric, D2/D5's warning, D1's sentence)
BUSY_WORDS = ("uncertain: busy", "The machine was busy while these runs were timed",
              "The computer was busy with something else while we timed it")
PAIR_TITLES = {get_spec(name).title: name for name in PAIR_NAMES}  # the sidebar box shows titles, the record names


def readme_pictures(text: str) -> list[str]:
    """The files under assets/ that the README shows, as Markdown images or <img src=...>, in order."""
    found = re.findall(r"!\[[^\]]*\]\(assets/([^)\s]+)\)|<img[^>]*\bsrc=\"assets/([^\"]+)\"", text)
    return list(dict.fromkeys(md or html for md, html in found))


def _one(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text, re.MULTILINE)
    return found.group(1).strip() if found else None


def picture_record(file: str, page_text: str, png: bytes, commit: str, dirty: bool, date: str) -> dict[str, Any]:
    """The record of one README picture: what the page said when it was taken (see test_browser._page_text) and its bytes."""
    # the batch lab draws a recording: its pair is the recording's, and the sidebar's boxes describe another load
    recorded = _one(r"^(?:Recorded with the same code|Measured just now on this server): pair ([\w.@-]+),", page_text)
    title = _one(r"^box: Model pair \(draft → target\) = (.+)$", page_text)
    target = None if recorded else _one(r"^box: Target precision = (?:automatic: )?(\w+)", page_text)
    draft = None if recorded else _one(r"\bdraft (\w+): ", page_text)  # D5's "Chosen here: …; draft int8: …"
    speedup = (_one(r"^metric: speed-up = (\S+)", page_text) or _one(r"^With the helper it was (.+?)\.$", page_text)
               or _one(r"both batched: (.+? at batch \d+ → .+? at batch \d+)\.", page_text))
    return {
        "file": file,
        "pair": recorded or PAIR_TITLES.get(title or "", title),
        "target_precision": target,
        "draft_precision": draft,
        "speedup": speedup.replace("*", "") if speedup else None,
        "c": _one(r"^metric: c \(draft ÷ target step\) = (\S+)", page_text),
        "busy": any(words in page_text for words in BUSY_WORDS),
        "commit": commit,
        "uncommitted_changes": dirty,
        "date": date,
        "sha256": hashlib.sha256(png).hexdigest(),
    }


def load_records(path: Path = RECORDS) -> dict[str, dict[str, Any]]:
    """The records by file name ({} when none were written yet)."""
    if not path.exists():
        return {}
    return {r["file"]: r for r in json.loads(path.read_text(encoding="utf-8"))["pictures"]}


def save_record(record: dict[str, Any], path: Path = RECORDS) -> None:
    """Write or replace the record of one picture, the others kept, sorted by file."""
    records = load_records(path) | {record["file"]: record}
    body = {"about": ABOUT, "pictures": [records[f] for f in sorted(records)]}
    path.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


PICTURES = readme_pictures(README.read_text(encoding="utf-8"))


def test_the_readme_shows_pictures() -> None:
    assert {"screenshot-d1.png", "screenshot-d5.png"} <= set(PICTURES), PICTURES


@pytest.mark.parametrize("file", PICTURES)
def test_each_readme_picture_is_recorded_with_the_default_pair_on_a_quiet_machine(file: str) -> None:
    """A picture replaced by any other run (another pair, a busy machine, a test run) no longer matches its record."""
    record = load_records().get(file)
    assert record is not None, f"assets/{file} has no record in assets/screenshots.json: retake it (see README)"
    png = (ROOT / "assets" / file).read_bytes()
    assert record["sha256"] == hashlib.sha256(png).hexdigest(), f"assets/{file} is not the picture its record describes"
    assert record["pair"] == DEFAULT_PAIR, f"assets/{file} was made with {record['pair']}, not the default {DEFAULT_PAIR}"
    assert record["busy"] is False, f"assets/{file} shows the busy-machine flag"


def test_the_busy_words_are_the_watch_pages_own() -> None:
    """A reworded warning would let a busy picture pass unseen: each phrase looked for is the Watch page's own
    (the page lays it out; its sentences are the lab's, labs/watch.py)."""
    source = "".join((ROOT / p).read_text(encoding="utf-8") for p in ("pages/watch.py", "specviz/labs/watch.py"))
    assert [w for w in BUSY_WORDS if w not in source] == []


D5_PAGE = """Watch it work
speed-up
1.31×
Chosen here: target fp16w: half the memory, faster here, and greedy output stays identical; draft int8: int8 unless …
metric: tokens / target call = 2.40 ()
metric: speed-up = 1.31× ()
metric: c (draft ÷ target step) = 0.412 ()
box: Model pair (draft → target) = Qwen2.5-Coder 0.5B → 1.5B
box: Target precision = automatic: fp16w · ≈ 4.0 GB"""


def test_a_record_reads_the_pair_precisions_and_figures_from_the_page() -> None:
    record = picture_record("screenshot-d5.png", D5_PAGE, b"png", "abc", False, "2026-12-02")
    assert record == {"file": "screenshot-d5.png", "pair": "qwen-coder", "target_precision": "fp16w",
                      "draft_precision": "int8", "speedup": "1.31×", "c": "0.412", "busy": False, "commit": "abc",
                      "uncommitted_changes": False, "date": "2026-12-02", "sha256": hashlib.sha256(b"png").hexdigest()}


def test_a_record_sees_the_busy_flag_at_d1_and_d5() -> None:
    d1 = ("box: Model pair (draft → target) = SmolLM2-135M int8 → itself\n"
          "The computer was busy with something else while we timed it, so we cannot tell this time how much sooner.")
    record = picture_record("screenshot-d1.png", d1, b"", "abc", False, "2026-12-02")
    assert (record["pair"], record["busy"], record["speedup"], record["draft_precision"]) == ("smollm2-135m", True, None, None)
    d5 = D5_PAGE.replace("1.31× ()", "1.31× (uncertain: busy)")
    assert picture_record("screenshot-d5.png", d5, b"", "abc", False, "2026-12-02")["busy"] is True
    d1_quiet = "box: Model pair (draft → target) = Qwen2.5-Coder 0.5B → 1.5B\nWith the helper it was a bit faster."
    assert picture_record("screenshot-d1.png", d1_quiet, b"", "abc", False, "2026-12-02")["speedup"] == "a bit faster"


def test_a_recording_is_described_by_its_own_pair_not_the_sidebars() -> None:
    page = ("box: Model pair (draft → target) = SmolLM2-135M int8 → itself\nbox: Target precision = automatic: fp32\n"
            "Speed-up of speculative decoding over plain decoding, both batched: 1.50× at batch 1 → 0.90× at batch 16. Every batched run was identical.\n"
            "Recorded with the same code: pair qwen-coder, cpu: x86_64, 2 logical cores, greedy, γ = 4.")
    record = picture_record("screenshot-batch.png", page, b"", "abc", False, "2026-12-02")
    assert (record["pair"], record["target_precision"], record["speedup"]) == \
        ("qwen-coder", None, "1.50× at batch 1 → 0.90× at batch 16")


def test_records_are_replaced_by_file_and_kept_sorted(tmp_path: Path) -> None:
    path = tmp_path / "shots.json"
    for file, commit in (("b.png", "1"), ("a.png", "1"), ("b.png", "2")):
        save_record({"file": file, "commit": commit}, path)
    assert [(r["file"], r["commit"]) for r in json.loads(path.read_text())["pictures"]] == [("a.png", "1"), ("b.png", "2")]


def test_the_readme_pictures_are_found_in_markdown_and_html() -> None:
    text = '![a](assets/x.png)\n<img src="assets/y.png" width="9">\n![b](https://e.org/z.png) ![a](assets/x.png)'
    assert readme_pictures(text) == ["x.png", "y.png"]
