"""AppTest of the "Same answer" lab page on the tiny-random pair (no real model)."""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from specviz.app.jobs import runner
from tests.test_page_watch import XSS, html, no_exception, texts, open_page as open_app_page, set_settings

PAGE = "pages/same_answer.py"


def open_page(**query: str) -> AppTest:
    return open_app_page(PAGE, **query)


def wait_for(at, done, timeout: float = 120.0):
    """Rerun the page until `done(at)` holds (the jobs run on the shared worker thread)."""
    end = time.time() + timeout
    while time.time() < end:
        at.run()
        no_exception(at)
        if done(at):
            # once more: a run that ended in the poll fragment's st.rerun leaves AppTest a tree without the sidebar
            at.run()
            no_exception(at)
            return at
        time.sleep(0.2)
    pytest.fail("the page did not show the result in time")


def set_level(at, level: str):
    return set_settings(at, level=level)


def greedy_done(at) -> bool:
    return "Identical" in texts(at) or "Exactly the same" in texts(at) or "Different from token" in texts(at)


def sampling_done(at) -> bool:
    return len(at.get("plotly_chart")) > 0


def draw(at, n: int = 200, tokens: int = 2):
    at.slider(key="same_answer.n").set_value(n)
    at.slider(key="same_answer.tokens").set_value(tokens)
    at.button(key="same_answer.sample_go").click()
    return wait_for(at, sampling_done)


def test_page_renders_without_running_a_model():
    at = open_page()
    assert at.text_area(key="same_answer.prompt").value.startswith("Once upon a time")
    assert at.slider(key="same_answer.n").value == 2000 and at.slider(key="same_answer.tokens").value == 2
    assert not at.get("plotly_chart") and not at.dataframe
    assert "Greedy: the very same tokens" in texts(at) or any("Greedy" in h.value for h in at.subheader)
    assert "uses the sidebar's sampling settings anyway" in texts(at)  # the sidebar is on greedy


def test_greedy_runs_are_identical_token_by_token_and_reused():
    at = open_page()
    assert "With the helper, will the big model write the very same words as on its own?" in texts(at)
    at.radio(key="same_answer.predict.same").set_value("No, some words change").run()
    at.button(key="same_answer.greedy_go").click()
    wait_for(at, greedy_done)
    assert "Identical: 16 of 16 tokens" in texts(at)
    assert "the answer is “Yes, word for word”" in html(at) and "Measured: all 16 words were the same" in html(at)
    table = at.dataframe[0].value
    assert len(table) == 16 and set(table["same?"]) == {"✓"}
    key = at.session_state["same_answer.greedy"][0]
    job = runner().get(key)
    at.button(key="same_answer.greedy_go").click().run()  # same settings: the same job, no new run
    no_exception(at)
    assert runner().get(key) is job and "Identical: 16 of 16 tokens" in texts(at)


def test_sampling_shows_the_test_and_levels_change_words_not_the_run():
    at = open_page(level="d2")
    draw(at)
    words = texts(at)
    assert "Passes" in words or "flags this run" in words
    labels = [m.label for m in at.metric]
    assert any("p-value" in label for label in labels) and any("total variation" in label for label in labels)
    fig = at.get("plotly_chart")[0].proto.spec
    assert "share of samples" in fig and "continuation" in fig
    ref_key, spec_key = at.session_state["same_answer.sampling"]
    jobs = (runner().get(ref_key), runner().get(spec_key))
    set_level(at, "d1")
    assert "how often" in at.get("plotly_chart")[0].proto.spec and not at.metric
    assert at.title[0].value == "Does the helper change the answer?" and texts(at) != words
    kids = texts(at)  # D1: the story's words, no symbols or jargon (issue 62)
    assert not [w for w in ("temperature", "top-p", "seed", "γ", "KV cache", "greedy") if w in kids], kids
    assert "roll the same loaded dice" in kids
    set_level(at, "d5")
    assert "degrees of freedom" in texts(at) and "Pearson" in texts(at)
    assert at.session_state["same_answer.sampling"] == (ref_key, spec_key)
    assert (runner().get(ref_key), runner().get(spec_key)) == jobs  # a view change never recomputes


def test_wrong_rule_reuses_the_target_samples():
    at = open_page()
    draw(at)
    ref_key, spec_key = at.session_state["same_answer.sampling"]
    ref_job = runner().get(ref_key)
    at.toggle(key="same_answer.wrong").set_value(True).run()
    no_exception(at)
    assert "settings changed" in texts(at)  # the old result stays, with a note
    at.button(key="same_answer.sample_go").click()
    wait_for(at, lambda a: a.session_state["same_answer.sampling"][1] != spec_key and sampling_done(a)
             and "settings changed" not in texts(a))
    new_ref, new_spec = at.session_state["same_answer.sampling"]
    assert new_ref == ref_key and runner().get(new_ref) is ref_job  # target-only samples are not redrawn
    assert new_spec[-1].rule == "topk" and new_spec[-1].top_k == 3
    assert "Caught" in texts(at) or "Not caught" in texts(at)


def test_sampling_job_keys_hold_the_settings():
    at = open_page(mode="sample", temp="1.2", top_p="0.9", seed="5", gamma="3")
    draw(at, n=100, tokens=1)
    ref_key, spec_key = at.session_state["same_answer.sampling"]
    cfg, spec = spec_key[-2], spec_key[-1]
    assert spec_key[1] == "tiny-random" and spec_key[2].startswith("Once upon a time")
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.seed) == (1.2, 0.9, 5)
    assert (cfg.n_samples, cfg.n_tokens, spec.gamma, spec.rule) == (100, 1, 3, "exact")
    assert "Sampling settings from the sidebar" in texts(at)


def test_empty_prompt_is_a_friendly_message():
    at = open_page()
    at.text_area(key="same_answer.prompt").input("   ").run()
    no_exception(at)
    assert "The prompt is empty" in texts(at)
    assert at.button(key="same_answer.greedy_go").disabled and at.button(key="same_answer.sample_go").disabled


def test_model_text_is_escaped_in_the_figure():
    at = open_page()
    at.text_area(key="same_answer.prompt").input(f"{XSS} {XSS}").run()
    draw(at, n=100)
    spec = at.get("plotly_chart")[0].proto.spec
    assert "<img" not in spec


def test_d5_int8_twin_shows_identity_breaking_and_the_targets_gap():
    """The same-arithmetic lesson: D5 only; the twin's runs part ways and the page says where and how close it was."""
    assert not [t for t in open_page(level="d2").toggle if t.key == "same_answer.twin"]
    at = open_page(level="d5")
    assert any("same arithmetic" in e.label for e in at.expander)
    at.toggle(key="same_answer.twin").set_value(True).run()
    at.button(key="same_answer.greedy_go").click()
    wait_for(at, greedy_done)
    words = texts(at)
    # tiny-random, story preset, 16 tokens: the int8 twin parted at token 4 when measured (fp32: identical)
    assert "Different from token" in words and "int8 twin" in words and "top two tokens" in words
    at.toggle(key="same_answer.twin").set_value(False).run()
    at.button(key="same_answer.greedy_go").click()
    wait_for(at, lambda a: "Identical: 16 of 16 tokens" in texts(a))


def test_a_later_visitor_is_told_how_long_the_samples_take_here_from_this_servers_last_test():
    """The time the press will take is this server's own, from its last test (never a fixed figure), and the run's
    record is offered for download with every figure the page states."""
    import json

    from specviz.labs import same_answer
    from specviz.viz import export

    at = open_page(level="d5")
    draw(at, n=200)
    wait_for(at, sampling_done)
    ref_key, spec_key = at.session_state["same_answer.sampling"]
    ref, spec = runner().get(ref_key).view().result, runner().get(spec_key).view().result
    downloads = [d for d in at.get("download_button")]
    assert len(downloads) == 1  # the samples' (the greedy comparison has not run)
    later = open_page(level="d5")
    later.slider(key="same_answer.n").set_value(400).run()
    expected = (ref.target.seconds + spec.seconds) / 200 * 400
    seconds, timed_at = same_answer.PACE.estimate("tiny-random", spec_key[-1].drafter, 2, 400)
    assert timed_at == 200 and seconds == pytest.approx(expected)
    assert f"About {seconds:.0f} s on this server for 400 samples each (from its last test, of 200)" in texts(later)
    test = same_answer.judge(ref, spec)
    record = json.loads(export.record_json(same_answer.sampling_record(ref, spec, test, spec_key[-1])))
    assert record["speculative"]["n"] == 200 and record["fit_spec"]["pvalue"] == test.fit_spec.pvalue
    assert record["law"]["probs"] == list(ref.law.probs) and record["target"]["seconds"] == ref.target.seconds


def test_d5_row_bits_ask_first_then_show_every_kernel_of_this_machine():
    """Why our text never drifts (D5 only): a prediction, then one row alone and inside 5 and 16 rows per kernel;
    specviz's kernels keep every bit (whatever torch's do here), and llama.cpp's case says why it is not shown."""
    assert not any("never drifts" in h.value for h in open_page(level="d2").subheader)
    at = open_page(level="d5")
    assert any("never drifts" in h.value for h in at.subheader)
    assert "Predict:" in texts(at) and "will its results have the very same bits?" in texts(at)
    assert not [d for d in at.dataframe if "kernel" in d.value.columns]
    assert "tiny-random is not made of packaged GGUF files" in texts(at)  # llama.cpp's case needs the GGUF pair
    at.radio(key="same_answer.predict.row_bits").set_value("Same bits in every kernel").run()
    at.button(key="same_answer.row_bits_go").click()
    wait_for(at, lambda a: any("kernel" in d.value.columns for d in a.dataframe))
    frame = next(d.value for d in at.dataframe if "kernel" in d.value.columns)
    assert list(frame.columns) == ["kernel", "whose", "inside 5 rows", "inside 16 rows"]
    ours = frame[frame["whose"] == "specviz"]
    assert len(ours) >= 1 and (ours[["inside 5 rows", "inside 16 rows"]] == "same bits").all().all()
    assert "torch's fp32 matmul (oneDNN / MKL)" in set(frame["kernel"])
    assert "Measured:" in html(at), "the prediction is answered by this machine's checks"
