"""AppTest of the "How far to guess" lab on the tiny random pair: a real γ sweep, cached per settings."""

from __future__ import annotations

import json
import time

import pytest
from streamlit.testing.v1 import AppTest

from specviz import host
from specviz.app import jobs
from tests.test_page_watch import html, no_exception, texts, open_page as open_app_page, set_settings

PAGE = "pages/how_far.py"


def open_page(**query: str) -> AppTest:
    return open_app_page(PAGE, **query)


def trace_names(at) -> list[str]:
    """Names of the traces of the page's first chart (the γ curves)."""
    return [t.get("name") for t in json.loads(at.get("plotly_chart")[0].proto.spec)["data"]]


def not_measured(at, prompt: str) -> bool:
    """No sweep of this prompt is on screen (a job of earlier settings, shared by the runner, may be)."""
    key = at.session_state["how_far.key"] if "how_far.key" in at.session_state else None
    return key is None or key[1].prompt != prompt


def measure(at, timeout: float = 120.0):
    """Press Measure and poll until the measured metrics (D2/D5) or the D1 sentence show."""
    at.button(key="how_far.run").click().run()
    no_exception(at)
    end = time.time() + timeout
    while time.time() < end:
        if any(m.label == "α (measured)" for m in at.metric) or "times as fast" in texts(at):
            return at
        time.sleep(0.2)
        at.run()
        no_exception(at)
    pytest.fail("the γ sweep did not finish in time")


def test_page_renders_without_running_a_model():
    at = open_page(max_new="13")  # settings no other test measures: the shared runner holds no job for them
    assert at.text_area(key="how_far.prompt").value.startswith("def fibonacci")
    assert at.multiselect(key="how_far.gammas").value == [1, 2, 4, 8]
    assert "Plan: the target alone, then one speculative run at each γ" in texts(at) and "that round 2 times" in texts(at)
    assert "how_far.key" not in at.session_state  # nothing runs until Measure
    # the sliders already draw Leviathan's curves for their own α and c
    assert at.slider(key="how_far.alpha").value == pytest.approx(0.8)
    assert len(at.get("plotly_chart")) == 1


def test_measure_shows_the_sweep_and_levels_change_words_not_the_run():
    at = measure(open_page(level="d5"))
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["α (measured)"]) <= 1.0 and float(metrics["c (measured)"]) > 0
    assert metrics["best γ (expected)"].isdigit() and metrics["target step"].endswith("ms")
    assert len(at.get("plotly_chart")) >= 2  # the curves and the verify-cost bars
    table = at.dataframe[0].value
    assert list(table["γ"]) == [1, 2, 4, 8] and (table["speed-up (measured)"] > 0).all()
    assert table["same text as target alone"].all()  # greedy: every γ writes the target's text
    assert "Measured here:" in texts(at) and "one-token steps" in texts(at)
    assert f"Measured on this machine: {host.machine_words()}," in texts(at)  # this machine, not a hard-coded one
    # D5: the share of rounds accepting their k-th guess, per γ, and the sentence read from the γ = 8 run
    assert "Acceptance by position" in texts(at) and len(at.get("plotly_chart")) >= 3
    assert "γ = 8: the 1st guess was accepted in" in texts(at)
    key = at.session_state["how_far.key"]
    job = jobs.runner().get(key)
    assert job.view().state == "done"
    d5_words = texts(at)
    other = open_page(level="d5")  # a second visitor, same settings: no answer before their prediction or press
    assert not other.metric and "how_far.key" not in other.session_state and "Answer" not in html(other)
    assert "Which number of guesses per round (γ) will be fastest here?" in texts(other)
    other.button(key="how_far.run").click().run()
    no_exception(other)
    assert other.session_state["how_far.key"] == key and jobs.runner().get(key) is job and other.metric
    set_settings(at, level="d1")
    no_exception(at)
    d1_words = texts(at)
    assert d1_words != d5_words and "Let's find out" in d1_words and "times as fast" in d1_words
    assert not at.metric and "Leviathan" not in d1_words and "Acceptance by position" not in d1_words
    jargon = [w for w in ("γ", "greedy", "KV cache", "temperature", "top-p") if w in d1_words]
    assert not jargon, jargon  # D1: the story's words (issue 62)
    set_settings(at, level="d2")
    no_exception(at)
    assert "How far should the draft model guess?" in texts(at)
    assert at.session_state["how_far.key"] == key and jobs.runner().get(key) is job  # nothing re-ran


def test_a_second_measure_with_the_same_settings_reuses_the_job_and_sliders_only_redraw():
    at = measure(open_page())
    key = at.session_state["how_far.key"]
    job = jobs.runner().get(key)
    measured_alpha = at.slider(key="how_far.alpha").value
    charts = len(at.get("plotly_chart"))
    at.button(key="how_far.run").click().run()
    no_exception(at)
    assert at.session_state["how_far.key"] == key and jobs.runner().get(key) is job and job.view().state == "done"
    # the sliders start on the measurement; moving one adds the sliders' curve, never a run
    at.slider(key="how_far.alpha").set_value(0.95 if measured_alpha < 0.9 else 0.5).run()
    no_exception(at)
    assert len(at.get("plotly_chart")) == charts
    assert "expected (your α, c)" in trace_names(at)
    assert jobs.runner().get(key) is job
    at.button(key="how_far.reset").click().run()
    assert at.slider(key="how_far.alpha").value == pytest.approx(measured_alpha)
    assert "expected (your α, c)" not in trace_names(at)


def test_a_new_gamma_choice_keeps_the_old_result_until_measured():
    at = measure(open_page())
    key = at.session_state["how_far.key"]
    at.multiselect(key="how_far.gammas").set_value([2, 3]).run()
    no_exception(at)
    assert "changed since this measurement" in texts(at)
    assert at.session_state["how_far.key"] == key and any(m.label == "α (measured)" for m in at.metric)


def test_empty_prompt_and_no_gamma_are_friendly_messages():
    at = open_page()
    at.text_area(key="how_far.prompt").input("   ").run()
    no_exception(at)
    assert "The prompt is empty" in texts(at)
    at.button(key="how_far.run").click().run()
    no_exception(at)
    assert not_measured(at, "   ")
    at.text_area(key="how_far.prompt").input("def f(x):").run()
    at.multiselect(key="how_far.gammas").set_value([]).run()
    no_exception(at)
    assert "Choose at least one γ" in texts(at)
    at.button(key="how_far.run").click().run()
    assert not_measured(at, "def f(x):")


def test_chain_or_tree_measures_both_shapes_on_both_presets():
    """The section runs only on its button; every run is real (tiny pair), greedy output stays the target's own."""
    at = open_page(level="d5", max_new="14")
    assert "Chain or tree?" in [h.value for h in at.subheader] and "how_far.shape_key" not in at.session_state
    assert "a chain of n guesses and a tree of n nodes" in texts(at)
    at.session_state["how_far.shape_sizes"] = [8, 2]
    at.button(key="how_far.shape_go").click().run()
    end = time.time() + 120
    while "fastest chain" not in texts(at) and time.time() < end:
        time.sleep(0.3)
        at.run()
        no_exception(at)
    words = texts(at)
    assert words.count("the tree got more tokens per target call than the chain at") == 2  # code and story
    assert "of 2 sizes" in words
    table = at.dataframe[-1].value
    assert list(table["n"]) == [2, 8, 2, 8] and set(table["same tokens as the target"]) == {"✓"}
    assert (table["tree: nodes / pass"] <= table["n"]).all() and (table["tree: nodes / pass"] > 0).all()
    names = {t.get("name") for t in json.loads(at.get("plotly_chart")[-1].proto.spec)["data"]}
    assert names == {"chain, γ = n", "tree, budget n, branching 2, depth ≤ n"}
