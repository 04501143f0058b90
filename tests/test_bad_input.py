"""Whatever a class types: each bad input gets a clear message from the page and the CLI, and nothing breaks."""

from __future__ import annotations

import json

import pytest

from specviz import cli
from specviz.settings import clean_prompt
from tests.test_page_watch import XSS, html, make_app, no_exception, play_to_end, texts

# prompts pupils type that are odd but legal: each must run and come back as the same text
ODD_PROMPTS = {
    "emoji": "🙂👩‍👩‍👧 héllo, ça va? 🚀",
    "right-to-left": "שלום עולם — مرحبا بالعالم",
    "mixed scripts": "Ελληνικά, русский, 日本語 and हिन्दी in one line",
    "markdown and latex": "# Title\n**bold** _it_ `code` $$\\frac{a}{b}$$ [link](javascript:alert(1))",
    "html and script": f"<script>alert(1)</script> {XSS} <b>bold</b>",
}


def test_clean_prompt_replaces_surrogates_and_drops_nul():
    text, notes = clean_prompt("a\ud800b\x00c\udfffd")
    assert text == "a\ufffdbc\ufffdd"
    assert any("2 invalid characters" in n for n in notes) and any("1 NUL character" in n for n in notes)
    for odd in ODD_PROMPTS.values():
        assert clean_prompt(odd) == (odd, [])  # legal text is never changed


@pytest.mark.parametrize("name", list(ODD_PROMPTS))
def test_cli_runs_odd_prompts_and_returns_them_unchanged(name, capsys):
    prompt = ODD_PROMPTS[name]
    assert cli.main(["generate", "--pair", "tiny-random", "--prompt", prompt, "--max-new-tokens", "4", "--json", "-q"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt"] == prompt


def test_cli_repairs_invalid_surrogates_and_nul(capsys):
    # undecodable bytes in argv reach Python as lone surrogates (surrogateescape)
    assert cli.main(["generate", "--pair", "tiny-random", "--prompt", "x\udcff\x00y", "--max-new-tokens", "3", "--json", "-q"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["prompt"] == "x\ufffdy"
    assert "became �" in captured.err and "NUL" in captured.err and "Traceback" not in captured.err


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_cli_refuses_empty_prompts_in_one_line(prompt, capsys):
    assert cli.main(["generate", "--pair", "tiny-random", "--prompt", prompt]) == 2
    assert "--prompt is empty" in capsys.readouterr().err


def test_cli_refuses_a_pasted_book_in_one_line(capsys):
    assert cli.main(["generate", "--pair", "tiny-random", "--prompt", "a" * 100_000, "-q"]) == 2
    err = capsys.readouterr().err
    assert "too long for this pair's context" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", list(ODD_PROMPTS))
def test_page_runs_odd_prompts_and_shows_them_as_text(name):
    prompt = ODD_PROMPTS[name]
    at = make_app()
    at.run()
    at.text_area(key="watch.prompt").input(prompt).run()
    play_to_end(at)
    body = html(at)
    assert "<script>" not in body and "<img src=x" not in body and "<b>bold" not in body
    assert "identical" in texts(at)  # greedy, so the run is still checked against the target alone


def test_page_drops_nul_bytes_from_a_link_prompt():
    # (a link cannot carry lone surrogates: browsers and Streamlit decode URLs to valid text)
    at = make_app(prompt="ok then\x00 more")
    at.run()
    no_exception(at)
    assert "1 NUL character removed" in texts(at)
    assert "Ready:" in texts(at)


def test_page_keeps_the_first_20000_characters_of_a_huge_link_and_says_so():
    at = make_app(prompt="word " * 20_000)  # 100,000 characters
    at.run()
    no_exception(at)
    assert "100,000 characters" in texts(at)
    assert len(at.text_area(key="watch.prompt").value) == 20_000
    assert "more than this model pair can read" in texts(at)  # and then the context check refuses it

# An unknown pair name in a link: settings.parse_query's note (tests/test_app_settings.py); the page would
# then load the default qwen pair, which this file keeps out of the test process.
