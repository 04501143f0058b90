"""The app's pure parts: settings <-> URL, prompt checks, presets, lesson data, background jobs."""

from __future__ import annotations

import re
import threading
import time

import pytest

from specviz import lessons
from specviz.core.limits import GAMMA_RANGE
from specviz.serve.worker import PairStore, Runner, RunnerBusy
from specviz.core.progress import Progress
from specviz.presets import PRESETS, get_preset, presets_in
from specviz.app.settings import parse_query, to_query
from specviz.settings import DEFAULTS, Settings, prompt_problem

PAIRS = ("qwen-coder", "smollm2-135m", "tiny-random")


def test_query_round_trip():
    s = Settings(level="d5", pair="smollm2-135m", drafter="ngram", mode="sample", temperature=0.7, top_p=0.9,
                 seed=42, gamma=6, max_new_tokens=100, presenter=True)
    back, notes = parse_query(to_query(s), PAIRS)
    assert back == s and notes == []
    assert to_query(DEFAULTS) == {}
    assert "temp" not in to_query(Settings(mode="greedy", temperature=1.5))  # meaningless in greedy mode


@pytest.mark.parametrize("params, field, value", [
    ({"gamma": "99"}, "gamma", GAMMA_RANGE[1]),
    ({"gamma": "0"}, "gamma", GAMMA_RANGE[0]),
    ({"max_new": "100000"}, "max_new_tokens", 256),
    ({"temp": "-3"}, "temperature", 0.05),
    ({"top_p": "7"}, "top_p", 1.0),
    ({"seed": "-1"}, "seed", 0),
])
def test_out_of_range_values_are_clamped_with_a_note(params, field, value):
    s, notes = parse_query(params, PAIRS)
    assert getattr(s, field) == value
    assert len(notes) == 1 and "using" in notes[0]


@pytest.mark.parametrize("params", [
    {"gamma": "lots"}, {"temp": "nan"}, {"level": "d9"}, {"mode": "beam"}, {"pair": "gpt-5"}, {"drafter": "x"},
    {"gamma": ["3", "abc"]},
])
def test_bad_values_are_ignored_with_a_note(params):
    s, notes = parse_query(params, PAIRS)
    assert s == DEFAULTS and len(notes) == 1


def test_list_values_take_the_last():
    s, _ = parse_query({"gamma": ["3", "5"], "level": ["d1"]}, PAIRS)
    assert s.gamma == 5 and s.level == "d1"


def test_settings_build_engine_configs():
    s = Settings(mode="sample", temperature=0.5, top_p=0.8, seed=3, gamma=7, max_new_tokens=20)
    cfg = s.generation_config()
    assert cfg.gamma == 7 and cfg.max_new_tokens == 20 and cfg.sampling.temperature == 0.5 and cfg.sampling.seed == 3
    assert s.baseline_config() == Settings(mode="sample", temperature=0.5, top_p=0.8, seed=3, gamma=2,
                                           max_new_tokens=20).baseline_config()  # γ never splits the baseline
    assert Settings(temperature=0.5).sampling == Settings(temperature=1.9).sampling  # greedy ignores temperature


def test_prompt_problems():
    assert "empty" in prompt_problem("   ", 0, 2048, 64)
    assert "more than this model pair can read" in prompt_problem("x", 2000, 2048, 64)
    assert prompt_problem("hello", 3, 2048, 64) is None


def test_presets_cover_both_groups():
    assert {p.id for p in presets_in("predictable")} == {"code", "json", "list", "copy"}
    assert {p.id for p in presets_in("creative")} == {"story", "poem"}
    assert get_preset("nope") is None and all(p.prompt.strip() for p in PRESETS)


def test_every_level_has_its_texts_and_labels():
    for level in lessons.LEVELS:
        assert lessons.has_lesson(level, "intro") and lessons.has_lesson(level, "race")
        lab = lessons.labels(level)
        for key in ("accepted", "rejected", "correction", "bonus", "round_name", "step1", "step4", "chart_title"):
            assert key in lab
        lab["round_name"].format(n=1)
        lab["summary_correction"].format(n=1, k=2, added=2)
    assert lessons.has_lesson("d1", "question") and lessons.has_lesson("d1", "answer")
    for key in ("rule", "tradeoff", "batching", "eagle", "trees"):
        assert lessons.has_lesson("d5", key)
    assert "MagicDec" in lessons.lesson("d5", "batching") and "EAGLE" in lessons.lesson("d5", "eagle")
    with pytest.raises(KeyError):
        lessons.lesson("d1", "rule")


def test_d1_words_carry_no_numbers_or_jargon():
    d1 = lessons.labels("d1")
    for key in ("accepted", "rejected", "correction", "bonus", "summary_correction", "summary_bonus"):
        assert not re.search(r"\d|token|probab|residual", d1[key]), key
    for key in ("intro", "question", "answer", "picture"):
        assert not re.search(r"\d|token|probab|residual|γ", lessons.lesson("d1", key)), key
    for key in ("cheap_intro", "cheap_pass", "cheap_batch", "cheap_hardware", "howfar_intro", "howfar_read",
                "where_intro", "where_why", "same_intro", "same_greedy", "same_sampling", "same_why", "helpers",
                "chain_or_tree"):  # the lab pages' D1 texts: the story's words (issue 62)
        assert not re.search(r"γ|KV cache|temperature|top-p|greedy|token", lessons.lesson("d1", key)), key
    for key in ("cheap_intro", "cheap_hardware", "howfar_read"):  # and no figure the visitor's machine decides
        assert not re.search(r"twice|about as long|\d", lessons.lesson("d1", key)), key


def _wait(pred, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_pair_store_loads_once_and_reports_failures():
    calls: list[str] = []
    gate = threading.Event()

    def loader(name, progress):
        calls.append(name)
        progress(0.5, "half")
        gate.wait(5)
        if name == "bad":
            raise RuntimeError("no such pair")
        return f"pair:{name}"

    store = PairStore(loader, lambda e: f"friendly: {e}")
    assert store.request("good").status == "loading"
    assert _wait(lambda: store.peek("good").message == "half")
    gate.set()
    assert _wait(lambda: store.request("good").status == "ready")
    assert store.request("good").pair == "pair:good" and calls == ["good"]
    store.request("bad")
    assert _wait(lambda: store.peek("bad").status == "failed")
    assert store.peek("bad").error == "friendly: no such pair"
    store.forget("bad")
    assert store.peek("bad") is None


def test_pair_store_holds_one_pair_and_releases_it_for_the_next():
    import gc
    import weakref

    class Pair:
        def __init__(self, name):
            self.name = name

    made: dict[str, weakref.ref] = {}

    def loader(name, progress):
        pair = Pair(name)
        made[name] = weakref.ref(pair)
        return pair

    store = PairStore(loader, str)
    store.request("a")
    assert _wait(lambda: store.peek("a").status == "ready")
    assert list(store.ready()) == ["a"]
    store.request("b")
    assert _wait(lambda: store.peek("b").status == "ready")
    assert list(store.ready()) == ["b"] and store.peek("a") is None  # a was released when b was asked for
    gc.collect()
    assert made["a"]() is None  # and nothing else kept it alive
    assert store.request("b").pair is made["b"]()  # the held one is reused, not reloaded
    two = PairStore(loader, str, max_ready=2)
    for name in ("x", "y"):
        two.request(name)
        assert _wait(lambda: two.peek(name).status == "ready")
    assert sorted(two.ready()) == ["x", "y"]


def test_finished_job_drops_its_closure():
    runner = Runner(str)
    big = bytearray(10)
    job = runner.submit("k", lambda: (b for b in big))
    assert _wait(lambda: job.view().finished)
    assert job._make is None  # a released pair's models are not kept alive by finished jobs


def _fake_steps(n: int, fail_at: int | None = None):
    def make():
        for i in range(n):
            if i == fail_at:
                raise ValueError("the prompt is empty")
            yield i
        return "done"
    return make


def test_runner_dedupes_keys_and_streams_rounds():
    runner = Runner(str)
    a = runner.submit("a", _fake_steps(3))
    assert runner.submit("a", _fake_steps(99)) is a
    assert _wait(lambda: a.view().finished)
    view = a.view()
    assert view.state == "done" and view.rounds == (0, 1, 2) and view.generation == "done"
    bad = runner.submit("bad", _fake_steps(3, fail_at=1))
    assert _wait(lambda: bad.view().finished)
    assert bad.view().state == "failed" and bad.view().error == "the prompt is empty" and bad.view().rounds == (0,)
    assert runner.submit("bad", _fake_steps(1)) is not bad  # a failed job may be retried


def test_runner_cancel_stops_after_the_current_round():
    def make():
        for i in range(1000):
            time.sleep(0.005)
            yield i
        return "done"

    runner = Runner(str)
    job = runner.submit("slow", make)
    assert _wait(lambda: len(job.view().rounds) >= 2)
    job.cancel()
    assert _wait(lambda: job.view().finished)
    assert job.view().state == "cancelled" and len(job.view().rounds) < 1000
    assert runner.submit("slow", make) is not job  # a stopped job is queued again on request


def test_runner_queue_is_bounded_and_reports_positions():
    gate = threading.Event()

    def blocked():
        gate.wait(10)
        yield 0
        return "first"

    def quick():
        yield 0
        return "ok"

    runner = Runner(str, max_queued=2)
    first = runner.submit("first", blocked)
    assert _wait(lambda: first.view().state == "running")
    a, b = runner.submit("a", quick), runner.submit("b", quick)
    assert (runner.ahead(first), runner.ahead(a), runner.ahead(b)) == (0, 1, 2)
    assert runner.queued() == 2
    with pytest.raises(RunnerBusy, match="already waiting"):
        runner.submit("c", quick)
    assert runner.submit("a", quick) is a  # an existing key is never refused
    gate.set()
    assert _wait(lambda: b.view().finished)
    assert b.view().result == "ok" and runner.ahead(b) == 0 and runner.queued() == 0
    assert runner.submit("c", quick) is not None  # room again


def test_job_progress_is_the_last_progress_yielded():
    def lab():
        for i in range(3):
            yield Progress(i + 1, 3, f"step {i + 1}")
        return {"answer": 42}

    runner = Runner(str)
    job = runner.submit("lab", lab)
    assert _wait(lambda: job.view().finished)
    view = job.view()
    assert view.progress == Progress(3, 3, "step 3") and view.progress.fraction == 1.0
    assert view.result == {"answer": 42}
    assert Progress(0, 0, "nothing").fraction == 0.0
