"""AppTest of the "Where it helps" lab: run the presets now (tiny random pair) or read the latest bench file."""

from __future__ import annotations

import json
import time

import pytest
from streamlit.testing.v1 import AppTest

from specviz import host, models
from specviz.app import jobs
from specviz.labs import where_it_helps
from specviz.viz import helpers as helpers_view
from tests.test_page_watch import html, no_exception, texts, open_page as open_app_page, set_settings

PAGE = "pages/where_it_helps.py"


def open_page(**query: str) -> AppTest:
    return open_app_page(PAGE, **query)


def run_workloads(at, timeout: float = 120.0):
    at.button(key="where_it_helps.run").click().run()
    no_exception(at)
    end = time.time() + timeout
    while time.time() < end:
        if at.get("plotly_chart"):
            return at
        time.sleep(0.2)
        at.run()
        no_exception(at)
    pytest.fail("the workloads did not finish in time")


def chart(at) -> dict:
    return json.loads(at.get("plotly_chart")[0].proto.spec)


def test_fast_pair_defaults_to_running_now_and_runs_nothing_before_asked():
    at = open_page(max_new="11")  # settings no other test runs: the shared runner holds no job for them
    assert at.radio(key="where_it_helps.source").value == "run"
    assert "fast enough on this CPU" in texts(at) and "Plan: for each of the 6 preset prompts" in texts(at)
    assert "where_it_helps.key" not in at.session_state and not at.get("plotly_chart")


def test_run_now_draws_bars_per_workload_and_levels_change_words_not_the_run():
    at = run_workloads(open_page(level="d2"))
    fig = chart(at)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert {t["name"] for t in bars} == {"predictable", "creative"}
    titles = {x.replace("<br>", " ") for t in bars for x in t["x"]}  # long names break into lines
    assert {"Code", "A JSON object", "A numbered list", "Copying from the prompt", "A story opening", "A poem"} <= titles
    assert fig["layout"]["yaxis"]["title"]["text"] == "speed-up (×) · dashed 1× = no gain"
    table = at.dataframe[0].value
    assert len(table) == 6 and (table["speed-up"] > 0).all()
    words = texts(at)
    assert "Measured now on this machine" in words and "workloads averaged" in words
    assert f"Measured now on this machine ({host.machine_words()})" in words  # this machine, not a hard-coded one
    assert "Why code and lists usually win and stories lose" in words
    key = at.session_state["where_it_helps.key"]
    job = jobs.runner().get(key)
    set_settings(at, level="d1")
    no_exception(at)
    kids = texts(at)
    assert kids != words and "Mercury" in kids and "times as fast" in kids
    jargon = [w for w in ("γ", "greedy", "KV cache", "temperature", "top-p", "speculative") if w in kids]
    assert not jargon, jargon  # D1: the story's words (issue 62)
    assert {t["name"] for t in chart(at)["data"] if t["type"] == "bar"} == {"easy to guess", "hard to guess"}
    set_settings(at, level="d5")
    no_exception(at)
    assert "min(1, p/q)" in texts(at) and "same text as target alone" in at.dataframe[0].value.columns
    assert at.session_state["where_it_helps.key"] == key and jobs.runner().get(key) is job  # nothing re-ran


def test_a_second_run_with_the_same_settings_reuses_the_job():
    at = run_workloads(open_page())
    key = at.session_state["where_it_helps.key"]
    job = jobs.runner().get(key)
    at.button(key="where_it_helps.run").click().run()
    no_exception(at)
    assert at.session_state["where_it_helps.key"] == key and jobs.runner().get(key) is job and job.view().state == "done"
    assert at.get("plotly_chart")  # still on screen, no progress bar

    # a second visitor with the same settings sees no answer until their own prediction or press
    other = open_page()
    assert not other.get("plotly_chart") and "where_it_helps.key" not in other.session_state
    assert "Answer" not in html(other) and "Which kind of text will the helper speed up most?" in texts(other)
    other.radio(key="where_it_helps.predict.workload").set_value("Code").run()
    no_exception(other)
    assert other.session_state["where_it_helps.key"] == key and other.get("plotly_chart")
    assert "You predicted “Code”" in html(other) and jobs.runner().get(key) is job  # the shared run, not a new one
    third = open_page()
    third.button(key="where_it_helps.run").click().run()  # or their own press: the same job answers at once
    no_exception(third)
    assert third.get("plotly_chart") and "Answer:" in html(third) and jobs.runner().get(key) is job


def test_changed_sidebar_settings_keep_the_old_bars_until_run():
    at = run_workloads(open_page())
    set_settings(at, gamma=6)
    no_exception(at)
    assert "changed since this measurement" in texts(at) and at.get("plotly_chart")


def test_bench_source_without_a_file_says_how_to_make_one():
    at = open_page()
    at.radio(key="where_it_helps.source").set_value("bench").run()
    no_exception(at)
    assert "No benchmark file for `tiny-random`" in texts(at) and "python -m specviz bench" in texts(at)


def test_slow_pair_opens_on_the_benchmark_file_without_loading_it(monkeypatch):
    if where_it_helps.find_bench("qwen-coder") is None:
        pytest.skip("no benchmark file for qwen-coder in this checkout")
    loads: list[str] = []
    real_load = models.load_pair

    def no_load(name, *args, **kwargs):  # reading a file must never load the 1.5B model
        loads.append(name)
        if name == "qwen-coder":
            raise models.PairError("not in this test")
        return real_load(name, *args, **kwargs)

    monkeypatch.setattr(models, "load_pair", no_load)
    at = open_page(level="d5")  # opened on the tiny pair: the Watch page (the default) loads its pair
    set_settings(at, pair="qwen-coder")
    no_exception(at)
    assert at.radio(key="where_it_helps.source").value == "bench"
    words = texts(at)
    assert "opens on the latest benchmark file" in words and "bench-qwen-coder.csv" in words and "machine:" in words
    assert at.selectbox(key="where_it_helps.bench_method").value == "spec-g4"
    assert not at.get("plotly_chart") and "Answer" not in html(at)  # the file is the answer: it waits for a press
    at.button(key="where_it_helps.bench_go").click().run()
    no_exception(at)
    assert "Answer:" in html(at)
    bars = [t for t in chart(at)["data"] if t["type"] == "bar"]
    assert {t["name"] for t in bars} == {"predictable", "creative"}
    at.selectbox(key="where_it_helps.bench_method").set_value("spec-adaptive").run()
    no_exception(at)
    assert "spec-adaptive" in texts(at)
    assert "qwen-coder" not in loads


def test_which_helper_wins_asks_first_then_races_the_helpers_on_the_tiny_pair():
    at = open_page(max_new="12", level="d2")
    assert "Which helper will make **Code (predictable)** fastest?" in texts(at)
    at.button(key="where_it_helps.helpers_go").click().run()
    no_exception(at)
    end = time.time() + 180
    while time.time() < end and not at.get("plotly_chart"):
        time.sleep(0.3)
        at.run()
        no_exception(at)
    names = {t["name"] for c in at.get("plotly_chart") for t in json.loads(c.proto.spec)["data"]}
    assert {"draft model", "prompt lookup", "head (chain)", "head (tree)"} <= names
    result = jobs.runner().get(at.session_state["where_it_helps.helpers_key"]).view().result
    assert helpers_view.verdict(result, "d2") in texts(at) and len(at.dataframe) == 1  # the verdict of this run
    assert sum("Answer:" in h.proto.body for h in at.get("html")) == 2  # both questions revealed (no prediction made)
