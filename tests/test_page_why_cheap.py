"""AppTest of the "Why checking is cheap" lab on the tiny-random pair: measure, read at each level, reuse the job."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from streamlit.testing.v1 import AppTest

from specviz import models
from specviz.bench import timing
from specviz.app import jobs
from specviz.labs import busy
from specviz.labs import why_cheap as vc
from tests.test_page_watch import html, no_exception, texts, open_page as open_app_page

PAGE = "pages/why_cheap.py"


def open_page(**query: str) -> AppTest:
    return open_app_page(PAGE, **query)


def wait_for(at: AppTest, done: Callable[[AppTest], bool], timeout: float = 120.0) -> AppTest:
    end = time.time() + timeout
    while time.time() < end:
        if done(at):
            return at
        time.sleep(0.2)
        at.run()
        no_exception(at)
    pytest.fail("the measurement did not finish in time")


def charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def chart_titles(at: AppTest) -> list[str]:
    out = []
    for spec in charts(at):
        layout = spec["layout"]
        out += [layout[ax]["title"]["text"] for ax in ("xaxis", "yaxis") if ax in layout]
    return out


def pass_done(at: AppTest) -> bool:
    return "One plain decoding step" in texts(at) or "words at once" in texts(at)


def busy_done(at: AppTest) -> bool:
    return "Speed-up of speculative decoding over plain decoding" in texts(at) or "pupils sharing it" in texts(at)


def test_page_opens_without_running_a_model():
    at = open_page()
    assert at.title[0].value == "Why checking is cheap"
    labels = [b.label for b in at.button]
    assert "Measure pass times" in labels and "Show the recorded measurement" in labels and "Measure on this server" in labels
    assert not at.get("plotly_chart")  # nothing measured yet
    # the shipped H200 figures: a second machine, clearly labelled, times only
    assert "A second machine: NVIDIA H200" in texts(at) and "random weights" in texts(at)
    assert "cannot pay on that GPU" in texts(at)
    assert any("--device cuda" in c.value for c in at.code)
    assert "why_cheap.pass" not in at.session_state


def test_pass_times_appear_words_follow_the_level_and_the_job_is_reused():
    at = open_page(level="d2")
    at.number_input(key="why_cheap.pass_repeats").set_value(2)
    at.button(key="why_cheap.go_pass").click().run()
    no_exception(at)
    wait_for(at, pass_done)
    key = at.session_state["why_cheap.pass"]
    assert key[0] == "why_cheap.pass" and key[1] == "tiny-random" and key[2].repeats == 2
    job = jobs.runner().get(key)
    assert job is not None and job.view().state == "done"
    assert "new tokens in one target pass" in chart_titles(at) and "time of the pass (ms)" in chart_titles(at)
    assert "cost of the pass (one-token steps)" in chart_titles(at)
    assert len(charts(at)) == 2
    d2_words = texts(at)
    assert "this server's CPU" in d2_words and "no GPU" in d2_words
    pair = models.load_pair("tiny-random")  # the page names the weights and kernel that ran, from the record
    assert f"target weights: {vc.weights_words(pair.target_precision, pair.target_kernel)}," in d2_words

    at.radio(key="cfg.level").set_value("d1").run()  # a view change: new words, same measurement
    no_exception(at)
    assert "words at once" in texts(at) and "One plain decoding step" not in texts(at)
    assert "Timed on this computer's processor" in texts(at) and "KV cache" not in texts(at)  # D1: the story's words
    assert "words checked at once" in chart_titles(at)
    at.radio(key="cfg.level").set_value("d5").run()
    no_exception(at)
    assert at.dataframe and "Arithmetic intensity" in texts(at)
    assert list(at.dataframe[0].value.columns)[:2] == ["new tokens", "median ms"]
    assert jobs.runner().get(key) is job

    at.button(key="why_cheap.go_pass").click().run()  # same settings again: the same job, nothing re-run
    no_exception(at)
    assert jobs.runner().get(key) is job and job.view().state == "done" and pass_done(at)

    at.number_input(key="why_cheap.pass_repeats").set_value(3).run()  # settings changed, not yet measured
    no_exception(at)
    assert "changed since this measurement" in texts(at) and pass_done(at)

    # a second visitor with the same settings: the shared measurement waits for their own prediction
    other = open_page(level="d2")
    other.number_input(key="why_cheap.pass_repeats").set_value(2).run()
    no_exception(other)
    assert not pass_done(other) and "why_cheap.pass" not in other.session_state and "Answer" not in html(other)
    other.radio(key="why_cheap.predict.cheap").set_value(other.radio(key="why_cheap.predict.cheap").options[0]).run()
    no_exception(other)
    assert pass_done(other) and other.session_state["why_cheap.pass"] == key and "You predicted" in html(other)
    assert jobs.runner().get(key) is job  # shared, not re-run


def test_the_recorded_batches_answer_the_prediction_with_chart_table_and_downloads():
    at = open_page(level="d5")
    at.radio(key="why_cheap.predict.busy").set_value("A bit faster").run()
    at.button(key="why_cheap.busy_recorded").click().run()
    no_exception(at)
    recording = busy.load_recording()
    last = recording.sizes[-1]
    assert f"{last.speedup:.2f}× as fast" in html(at) and "You predicted “A bit faster”" in html(at)
    assert busy.busy_words(recording, "d5").split(" Verify cost")[0].replace("**", "") in texts(at).replace("**", "")
    assert "runs sharing the big model (batch size)" in chart_titles(at)
    spec = next(c for c in charts(at) if c["layout"]["xaxis"]["title"]["text"].startswith("runs sharing"))
    assert any("prompts of 1500 tokens" in str(t.get("name")) for t in spec["data"])  # D5: the long-context recording
    table = next(d.value for d in at.dataframe if "verify cost (steps)" in d.value.columns)
    assert list(table["batch"]) == [s.batch for s in recording.sizes]
    assert {b.label for b in at.get("download_button")} == {"CSV", "JSON"}
    assert "MagicDec (2024)" in texts(at) and "Recorded with the same code" in texts(at)
    at.radio(key="cfg.level").set_value("d1").run()
    no_exception(at)
    assert "pupils sharing it" in texts(at) and "pupils sharing the big model" in chart_titles(at)


def test_a_live_batch_measurement_runs_as_a_job_with_the_sidebars_gamma():
    at = open_page(level="d2", gamma="3")
    at.number_input(key="why_cheap.busy_repeats").set_value(1)
    at.button(key="why_cheap.busy_live").click().run()
    no_exception(at)
    wait_for(at, busy_done, timeout=240)
    key = at.session_state["why_cheap.busy"]
    assert key[0] == "why_cheap.busy" and key[2].gamma == 3 and key[2].repeats == 1
    assert "Measured just now on this server" in texts(at)
    table = next(d.value for d in at.dataframe if "verify cost (steps)" in d.value.columns)
    assert list(table["batch"]) == list(busy.LAB_SIZES) and all(table["identical to alone"])


def test_a_classroom_shows_the_recording_unless_the_operator_allows_live_batches(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CLASSROOM", "1")
    at = open_page(level="d2")
    assert not any(b.key == "why_cheap.busy_live" for b in at.button)
    assert "SPECVIZ_CLASSROOM_LIVE_BATCH=1" in texts(at)
    monkeypatch.setenv("SPECVIZ_CLASSROOM_LIVE_BATCH", "1")
    at = open_page(level="d2")
    assert any(b.key == "why_cheap.busy_live" for b in at.button)


def test_gpu_figures_file_is_shown_when_present(tmp_path, monkeypatch):
    cost = vc.PassCost("qwen-coder", timing.Machine("cuda", "Test GPU", 8), 93, (1, 2, 4), ((10.0,), (10.5,), (11.0,)))
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"note": "measured for a test", "pass_cost": vc.pass_cost_to_dict(cost)}), "utf-8")
    original = vc.load_reference
    monkeypatch.setattr(vc, "load_reference", lambda: original(path))
    at = open_page(level="d2")
    assert "No GPU figures measured yet" not in texts(at)
    assert "Test GPU" in texts(at) and "measured for a test" in texts(at)


def kernels_done(at: AppTest) -> bool:
    return "one row" in texts(at) or "Nothing to compare" in texts(at)


def test_both_kernels_are_timed_side_by_side_on_one_layer_of_an_fp16w_target():
    from specviz.models import half, rowgemm

    at = open_page(level="d5", pair="tiny-random@fp16w")
    at.number_input(key="why_cheap.kernels_repeats").set_value(2)
    at.button(key="why_cheap.go_kernels").click().run()
    no_exception(at)
    wait_for(at, kernels_done)
    if rowgemm.kernel() is None or not half.fbgemm_works():
        assert "Nothing to compare" in texts(at)
        return
    words = texts(at)
    assert f"rowgemm {rowgemm.kernel().isa}" in words and "fbgemm" in words and "such layers" in words
    assert "rows scored at once" in chart_titles(at)
    table = [d for d in at.dataframe if "rows" in d.value.columns]
    assert table and list(table[0].value["rows"]) == [1, 2, 4, 8, 16]


def test_an_fp32_target_has_no_kernels_to_compare():
    at = open_page(level="d2")
    at.number_input(key="why_cheap.kernels_repeats").set_value(2)
    at.button(key="why_cheap.go_kernels").click().run()
    no_exception(at)
    wait_for(at, kernels_done)
    assert "does not keep its weights in fp16" in texts(at)


def test_d5_profiles_a_round_and_its_parts_add_up():
    at = open_page(level="d5")
    assert "Where a round's time goes" in [h.value for h in at.subheader]
    at.button(key="why_cheap.go_profile").click().run()
    no_exception(at)
    wait_for(at, lambda a: "A round took" in texts(a))
    key = at.session_state["why_cheap.profile"]
    found = jobs.runner().get(key).view().result
    assert found.rounds > 0 and {p.role for p in found.parts} >= {"draft", "verify", "round"}
    assert abs(sum(p.ms for p in found.parts) - found.round_ms) < 0.05 * found.round_ms + 0.5  # python is the rest
    assert any(p.what.startswith("matmul output layer") for p in found.parts if p.role == "verify")
    assert f"A round took **{found.round_ms:.0f} ms**".replace("**", "") in texts(at).replace("**", "")
    assert "ms per round" in " ".join(chart_titles(at))
    at.radio(key="cfg.level").set_value("d2").run()
    no_exception(at)
    assert "Where a round's time goes" not in [h.value for h in at.subheader]


@pytest.mark.parametrize("steps, words", [(1.02, "about one step (1.02)"), (1.15, "about one step"),
                                          (1.39, "a bit more than one step (1.39)"), (2.5, "2.50 steps: well over one")])
def test_the_sentence_beside_a_pass_cost_agrees_with_its_number(steps, words):
    from specviz.viz import why_cheap as view

    assert view.cost_words(steps).startswith(words)


def test_two_precisions_ask_first_and_a_target_without_blocks_is_told_why():
    """The two-precision section asks its question before any answer; on the tiny pair (an fp32 target, no GGUF
    blocks) its press ends in one line saying what it needs, never a traceback."""
    at = open_page(level="d2")
    assert any("Two precisions" in h.value for h in at.subheader)
    assert "which checks 16 new tokens at once more cheaply?" in texts(at)
    at.radio(key="why_cheap.predict.precision").set_value("The 4-bit one").run()
    at.button(key="why_cheap.go_precisions").click()
    wait_for(at, lambda a: "needs the gguf precision" in texts(a) + html(a))
    assert "Traceback" not in texts(at) and not at.exception
