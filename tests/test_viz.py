"""Views of recorded runs: frame maths, escaped token strips, figures and trace exports (no model needed)."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import pytest

from specviz.core.trace import GenerationConfig, Generation, RoundTrace, TopDist
from specviz.labs import busy
from specviz.labs import how_far
from specviz.lessons import labels
from specviz.viz import export
from specviz.viz import watch as watch_view
from specviz.viz import playback as pb
from specviz.viz import strip

XSS = "<img src=x onerror=alert(1)>"
L = labels("d2")


def _round(index: int, drafts: tuple[str, ...], n_accepted: int, next_text: str, origin: str = "correction",
           position: int = 0) -> RoundTrace:
    k = len(drafts)
    rejected = n_accepted < k
    ids = tuple(range(10 + index * 20, 10 + index * 20 + k))
    top = TopDist((1, 2, 3), (0.6, 0.3, 0.1), ("a", " b", XSS))
    return RoundTrace(
        index=index, position=position, draft_ids=ids, draft_texts=drafts,
        p_draft=tuple(0.5 for _ in drafts), q_draft=tuple(0.8 for _ in drafts),
        accept_probs=tuple(0.625 for _ in drafts), uniforms=tuple(0.1 if i < n_accepted else 0.9 for i in range(k)),
        accepted=tuple(i < n_accepted for i in range(k)), n_accepted=n_accepted,
        next_id=3 if rejected else 7, next_text=next_text, next_origin=origin if k else "target",
        p_top=top, q_top=TopDist((2, 1), (0.7, 0.3), (" b", "a")) if rejected else None,
        residual_top=TopDist((1, 3), (0.8, 0.2), ("a", XSS)), draft_ms=2.0 * k, verify_ms=10.0,
    )


@pytest.fixture()
def rounds() -> tuple[RoundTrace, ...]:
    return (
        _round(0, ("def", " f", "(", "x"), 2, XSS),  # 2 kept, rejected at 3, correction
        _round(1, ("a", "b"), 2, "!", "bonus", position=3),  # all kept, bonus
        _round(2, (), 0, "z", position=6),  # nothing drafted (n-gram found nothing)
    )


def _generation(rounds: tuple[RoundTrace, ...]) -> Generation:
    tokens = tuple(t for r in rounds for t in r.new_ids)
    return Generation("speculative", "model", GenerationConfig(max_new_tokens=8, gamma=4), (1, 2), tokens, "text",
                      rounds, 1.0, sum(pb.round_ms(r) for r in rounds), "max_new_tokens")


def test_frames_per_round_and_locate(rounds):
    assert [pb.round_frames(r) for r in rounds] == [4 + 3 + 1, 2 + 2 + 1, 1]
    assert pb.total_frames(rounds) == 14
    assert pb.locate(rounds, 0) == pb.Cursor(0, 0, 0)
    assert pb.locate(rounds, 8) == pb.Cursor(1, 0, 8)
    assert pb.locate(rounds, 999) == pb.Cursor(2, 0, 13)
    assert pb.locate((), 3) is None
    assert pb.round_end_frame(rounds, 0) == 7 and pb.round_end_frame(rounds, 1) == 12
    assert pb.locate(rounds, 7).complete(rounds) and not pb.locate(rounds, 6).complete(rounds)


def test_lane_states_sweep(rounds):
    r = rounds[0]
    assert pb.lane_state(r, 0) == pb.LaneState(1, 0, False, "draft")
    assert pb.lane_state(r, 3) == pb.LaneState(4, 0, False, "draft")
    assert pb.lane_state(r, 4) == pb.LaneState(4, 1, False, "verify")
    assert pb.lane_state(r, 6) == pb.LaneState(4, 3, False, "verify")
    assert pb.lane_state(r, 7) == pb.LaneState(4, 3, True, "final")


def test_text_segments_follow_the_sweep(rounds):
    r = rounds[0]
    drafting = pb.round_segments(r, pb.lane_state(r, 3))
    assert [s.kind for s in drafting] == ["pending"] * 4
    swept = pb.round_segments(r, pb.lane_state(r, 6))  # 2 accepted, 3rd rejected: it and the 4th vanish
    assert [(s.text, s.kind) for s in swept] == [("def", "accepted"), (" f", "accepted")]
    full = pb.text_segments(rounds, pb.locate(rounds, 13))
    assert "".join(s.text for s in full) == "def f" + XSS + "ab!z"
    assert [s.kind for s in full][-3:] == ["accepted", "bonus", "target"]


def test_running_points_and_race(rounds):
    pts = pb.running_points(rounds, base_ms_per_token=20.0)
    assert [p.round for p in pts] == [1, 2, 3]
    assert pts[0].acceptance == pytest.approx(2 / 4) and pts[1].acceptance == pytest.approx(4 / 6)
    assert pts[0].tokens_per_call == 3.0
    assert pts[0].speedup == pytest.approx(20.0 / ((8 + 10) / 3))
    assert pb.running_points(rounds, None)[0].speedup is None
    tl = pb.race_timeline(rounds, max_tokens=6)
    assert tl.tokens == (3, 6, 6) and tl.total_ms == pytest.approx(18 + 14 + 10)
    assert tl.at(0) == (0, 0) and tl.at(18) == (1, 3)
    assert tl.text_at(1e9) == "def f" + XSS + "ab!"


def test_token_strip_escapes_model_text(rounds):
    """Model and user text must never become markup: an <img onerror> stays inert text."""
    r = rounds[0]
    lane = strip.lane_html(r, pb.full_lane(r), L, current=True, detail=XSS)
    text = strip.text_html(XSS, pb.text_segments(rounds, pb.locate(rounds, 13)), L)
    table = strip.rule_table_html(_round(0, (XSS,), 0, "x"), 0, "d2", True)
    race = strip.race_html(XSS, XSS, 1, 2, True, "sv-spec")
    for html_out in (lane, text, table, race):
        assert "<img" not in html_out and "onerror=alert(1)&gt;" in html_out
        assert "&lt;img" in html_out
    assert "&lt;img src=x onerror=alert(1)&gt;" in text + race
    assert strip.token_label("a\nb\t") == "a↵b⇥" and strip.token_label("") == "∅"
    assert strip.token_label(" x") == '<span class="sv-ws">·</span>x'
    assert strip.esc('"') == "&quot;"


def test_lane_marks_and_struck_tokens(rounds):
    r = rounds[0]
    lane = strip.lane_html(r, pb.full_lane(r), L)
    assert lane.count("sv-acc") == 2 and lane.count("sv-rej") == 1 and lane.count("sv-struck") == 1
    assert "✓" in lane and "✗" in lane and "sv-cor" in lane
    bonus = strip.lane_html(rounds[1], pb.full_lane(rounds[1]), L)
    assert "sv-bon" in bonus and "★" in bonus
    mid = strip.lane_html(r, pb.lane_state(r, 2), L)
    assert mid.count("sv-pend") == 3 and "sv-slot" in mid


def test_markdown_escape_for_widget_labels():
    assert strip.md_escape("*a*_$x$") == r"\*a\*\_\$x\$"
    label = strip.pill_label(_round(0, ("**bold**",), 0, "x"), 0, True)
    assert label.startswith("1: \\*\\*bold") and label.endswith("✗")


def test_speed_words_have_no_numbers():
    for x in (None, 0.5, 1.0, 1.3, 2.0, 3.0, 9.0):
        assert not any(ch.isdigit() for ch in strip.speed_words(x))


@pytest.mark.parametrize("ratio, words", [
    (0.5, "slower"), (0.94, "slower"), (0.95, "about the same speed"), (1.09, "about the same speed"),
    (1.10, "a bit faster"), (1.31, "a bit faster"), (1.35, "half again as fast"), (1.51, "half again as fast"),
    (1.74, "half again as fast"), (1.75, "about twice as fast"), (2.2, "about twice as fast"),
    (2.5, "several times faster"), (10.5, "several times faster")])
def test_d1s_words_follow_the_measured_ratio_in_steps_a_child_can_tell_apart(ratio, words):
    """1.31× and 1.51× no longer read alike ("a bit faster" for both, as a teacher saw): one table, every step."""
    from specviz.lessons import speed_words

    assert speed_words(ratio) == words
    assert strip.speed_words(ratio).startswith(words)
    assert busy.speed_phrase(ratio) == words


def test_figures_build(rounds):
    fig = watch_view.rejection_figure(rounds[0], L)
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    assert all("<img" not in t for t in fig.layout.xaxis.ticktext)
    assert watch_view.rejection_figure(rounds[1], L) is None  # a bonus round has no rejection
    assert len(watch_view.running_figure(pb.running_points(rounds, 20.0), L).data) == 2
    assert len(watch_view.running_figure(pb.running_points(rounds, None), L).data) == 1
    tl = pb.race_timeline(rounds)
    assert len(watch_view.race_figure(tl, tl, L).data) == 2
    book = how_far.leviathan_curves(0.7, 0.1)
    assert len(watch_view.tradeoff_figure(book, None, 4, 1.8, L).data) == 4  # curve, best γ, this γ, measured
    cost = how_far.verify_cost_curves(0.7, 0.1, how_far.VerifyFit(0.6, 0.3, 5))
    assert len(watch_view.tradeoff_figure(book, cost, 4, 1.8, L).data) == 5  # and the dashed textbook curve
    assert len(watch_view.verify_cost_figure(rounds, rounds, L).data) == 2


def test_trace_csv_and_json(rounds):
    gen = _generation(rounds)
    frame = export.trace_frame(gen)
    assert list(frame.columns) == list(export.CSV_COLUMNS)
    assert len(frame) == 4 + 1 + 2 + 1 + 1
    assert list(frame[frame["round"] == 0]["verdict"]) == ["accepted", "accepted", "rejected", "discarded", "added"]
    back = pd.read_csv(__import__("io").StringIO(export.trace_csv(gen)))
    assert back["token_text"].tolist()[4] == XSS
    doc = json.loads(export.trace_json(gen, gen, {"prompt": XSS}))
    assert doc["meta"]["prompt"] == XSS
    assert doc["summary"]["speedup"] == pytest.approx(1.0)
    assert len(doc["speculative"]["rounds"]) == 3 and doc["baseline"]["kind"] == "speculative"
    assert doc["speculative"]["rounds"][0]["p_top"]["texts"][2] == XSS


def test_the_head_recipe_line_says_each_stage_and_each_guess_from_the_manifest():
    first = {"recipe": {"train": {"steps": 1100}}, "sha256": "ab" * 32}
    man = {"recipe": {"record": {"prompts": 400, "chunk": 40}, "vocab": 32768, "train": {"steps": 600, "batch": 8, "window": 128,
                                                                              "seed": 0, "unroll": 3}},
           "counts": {"recorded_tokens": 82437, "text_tokens": 262144}, "started_from": first, "seconds": 3600,
           "bytes": 39_000_000, "sha256": "cd" * 32, "trained_on": {"machine": "2 CPU cores"},
           "held_out": {"sampled_acceptance": [0.49, 0.55], "greedy_agreement": [0.52, 0.6],
                        "by_guess": {"greedy_agreement": [[0.52, 0.6], [0.3, 0.5], [0.1, 0.45]]}}}
    line = watch_view.head_recipe_line(man)
    assert ("82,437 tokens of the target's own continuations of 360 prompts (400 recorded: 40 held out to score it) "
            "and 262,144 tokens of code") in line
    assert "1100 steps on the target's real notes (head abababababab…), then 600 steps of 8×128 positions" in line
    assert "60 min for the second stage on 2 CPU cores" in line
    assert "guessing 3 tokens ahead" in line and "60% / 50% / 45%" in line and "sampled acceptance was 0.55" in line
    third = {**man, "started_from": {**man, "sha256": "ef" * 32, "seconds": 1800}, "seconds": 2400}
    third["recipe"] = {**man["recipe"], "also_record": [{"prompts": 600, "seed": 1}]}
    third["counts"] = {**man["counts"], "left_out_sequences": 17}
    line = watch_view.head_recipe_line(third)
    assert ("1100 steps on the target's real notes (head abababababab…), then 600 steps guessing 3 tokens ahead "
            "(head efefefefefef…), then 600 steps of 8×128 positions") in line
    assert "of 943 prompts (1,000 recorded: 40 held out to score it, 17 left out because they open a held-out one)" in line
    assert "40 min for the third stage" in line
    assert "of 400 prompts and" in watch_view.head_recipe_line({**man, "recipe": {**man["recipe"], "record": {"prompts": 400}}})
    old = {k: v for k, v in man.items() if k != "started_from"}
    old["held_out"] = {"sampled_acceptance": [0.0, 0.49], "greedy_agreement": [0.0, 0.53]}
    old["recipe"] = {**man["recipe"], "train": {"steps": 1100, "batch": 8, "window": 128, "seed": 0}}
    line = watch_view.head_recipe_line(old)
    assert "then" not in line and "ahead" not in line and "second stage" not in line and "53% of the time" in line
