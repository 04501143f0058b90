"""A class at once: concurrent browser-like sessions on a real app server (tiny pair), each checked."""

from __future__ import annotations

import pytest

from specviz.bench import loadtest
from specviz.cli import main

SESSIONS = 8


def test_ahead_line_is_parsed():
    assert loadtest._ahead_in("Waiting for the model: 3 runs ahead of you.") == 3
    assert loadtest._ahead_in("Waiting for the model: 1 run ahead of you.") == 1
    assert loadtest._ahead_in("Run complete") == 0


def test_session_prompts_differ():
    prompts = {loadtest.session_prompt(i) for i in range(30)}
    assert len(prompts) == 30  # each session queues its own runs, none shares a cached one


def test_a_class_mix_puts_half_the_sessions_on_presets():
    cfg = loadtest.LoadConfig(sessions=30, preset_share=0.5)
    prompts = [cfg.prompt(i) for i in range(30)]
    presets = {loadtest.get_preset(name).prompt for name in loadtest.CLASS_PRESETS}
    assert sum(p in presets for p in prompts) == 15 and set(prompts) >= presets
    assert len(set(prompts)) == 15 + 3  # the others type prompts of their own
    with pytest.raises(ValueError, match="preset_share"):
        loadtest.LoadConfig(preset_share=1.5)


@pytest.mark.slow
@pytest.mark.parametrize("drafter, class_memory", [("model", False), ("hybrid", True)])
def test_eight_sessions_at_once_all_correct_with_bounded_memory(capsys, drafter, class_memory):
    """Half the class on presets: two pupils on one preset are served by one run (the same recorded trace), unless
    the drafter remembers: then each pupil's run is their own (here with the class's memory on)."""
    report = loadtest.run_loadtest(loadtest.LoadConfig(sessions=SESSIONS, timeout_s=600, preset_share=0.5,
                                                       drafter=drafter, class_memory=class_memory))
    figures = report.as_dict()
    with capsys.disabled():
        print(f"\nload test, {SESSIONS} sessions: {figures}")
    assert figures["failures"] == [], figures["failures"]
    assert report.passed == SESSIONS
    assert figures["on_presets"] == 4 and figures["distinct_prompts"] == 7
    # the code preset: two sessions, one run (two runs when each remembers for its own visitor)
    assert list(figures["runs_per_shared_prompt"].values()) == [1 if drafter == "model" else 2]
    assert all(r.latency_s is not None for r in report.results)
    # every pupil saw a round drawn before the whole result was there (or at the latest with it)
    assert all(r.first_round_s is not None and 0 < r.first_round_s <= r.latency_s for r in report.results)
    # (no queue to be told about here: the server advances up to 40 runs together, so these 16 never wait behind
    # each other for long; where a place in the queue is shown is the runner tests' business)
    # sessions share one copy of the models: eight sessions' runs add little to the server's memory
    assert report.server_peak_rss_mb - report.server_start_rss_mb < 400, figures["server_rss_mb"]


def test_cli_refuses_bad_loadtest_arguments(capsys):
    assert main(["loadtest", "--sessions", "0"]) == 2
    assert "--sessions must be 1..200" in capsys.readouterr().err
    assert main(["loadtest", "--pair", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_full_queue_is_a_message_not_an_error(monkeypatch):
    from specviz.app import jobs
    from specviz.serve.worker import RunnerBusy
    from tests.test_page_watch import make_app, no_exception, texts

    at = make_app(prompt="a prompt nobody else runs in these tests")
    at.run()

    def full(*args, **kwargs):
        raise RunnerBusy("72 runs are already waiting for the model; please try again in a minute")

    monkeypatch.setattr(jobs.runner(), "submit", full)
    at.button(key="watch.play").click().run()
    no_exception(at)
    assert loadtest.BUSY_TEXT in texts(at) and "try again in a minute" in texts(at)
    assert at.button(key="watch.play").label == "Play"  # not stuck "playing" a run that does not exist


def test_loadtest_refuses_an_unknown_drafter_in_one_line(capsys):
    assert main(["loadtest", "--drafter", "telepathy"]) == 2
    assert "telepathy" in capsys.readouterr().err
