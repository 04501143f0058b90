"""Two precisions, one lesson: the crossing, the best γ and every sentence on curves of both precisions recorded on a
2-core Zen 4 (2026-12-08, tests/data/precisions-zen4.json: both crossed 1.5 steps there, the 4-bit one sooner; the
draft's c was 0.39 beside the 4-bit target and 0.21 beside the 16-bit one), on that recording with its 16-bit curve
kept under 1.5 steps (the case the issue describes), and the 16-bit copy on the real default target."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specviz.core import metrics
from specviz.labs import precisions
from specviz.labs.precisions import CROSS
from specviz.viz import precisions as view
from specviz.viz import predict as predict_view

RECORDED = Path(__file__).parent / "data" / "precisions-zen4.json"


@pytest.fixture(scope="module")
def two() -> precisions.TwoPrecisions:
    return precisions.from_dict(json.loads(RECORDED.read_text()))


def flat_sixteen(two: precisions.TwoPrecisions) -> precisions.TwoPrecisions:
    """The recording with its 16-bit passes pulled under 1.5 steps (each pass's excess over a step shrunk tenfold): the
    memory-bound 16-bit curve the issue measured up to 5 tokens."""
    cost = two.sixteen.cost
    step = cost.step_ms
    times = tuple(tuple(step + (t - step) / 10 for t in ts) for ts in cost.times_ms)
    return replace(two, sixteen=replace(two.sixteen, cost=replace(cost, times_ms=times)))


def test_the_recording_is_the_lesson_both_ways(two) -> None:
    assert two.four.crossing() is not None and two.four.crossing() < two.sixteen.crossing()
    assert two.four.cost.step_ms < two.sixteen.cost.step_ms and two.four.c > two.sixteen.c
    assert two.four.best(0.8)[0] < two.sixteen.best(0.8)[0], "a dearer draft beside the quicker step: a shorter chain"
    assert flat_sixteen(two).sixteen.crossing() is None and flat_sixteen(two).four.crossing() == two.four.crossing()
    assert precisions.to_dict(precisions.from_dict(precisions.to_dict(two))) == precisions.to_dict(two)


def test_crossing_is_read_between_the_measured_points(two) -> None:
    at = two.four.crossing()
    ks, ratios = two.four.cost.ks, two.four.cost.ratios
    i = next(i for i, r in enumerate(ratios) if r >= CROSS)
    assert ks[i - 1] < at <= ks[i] and ratios[i - 1] < CROSS
    assert two.four.steps_at(at) == pytest.approx(CROSS)
    assert two.four.steps_at(ks[i]) == pytest.approx(ratios[i]) and two.four.steps_at(100) == ratios[-1]


def test_best_gamma_is_leviathans_with_each_curves_verify_cost(two) -> None:
    for curve in (two.four, two.sixteen):
        gamma, speedup = curve.best(0.8)
        assert speedup == pytest.approx(metrics.expected_speedup_at_cost(0.8, gamma, curve.c, curve.steps_at(gamma + 1)))
        assert all(curve.speedup(0.8, g) <= speedup for g in precisions.GAMMAS)


@pytest.mark.parametrize("flat", [False, True])
def test_every_sentence_states_the_recordings_own_numbers(two, flat) -> None:
    two = flat_sixteen(two) if flat else two
    top = two.four.cost.ks[-1]
    d1 = view.words(two, "d1")
    assert f"{two.sixteen.cost.step_ms / 1000:.2f} seconds" in d1 and f"{two.four.steps_at(top):.1f} times" in d1
    ending = {"sixteen": "checking many words costs more of them", "four": "quicker for one word and for checking too",
              None: "about the same share"}[view.cheaper_to_check(two, top)]
    assert ending in d1 and "γ" not in d1 and " ms" not in d1
    assert (ending == "checking many words costs more of them") == flat
    d2 = view.words(two, "d2")
    assert f"**{two.four.crossing():.1f} new tokens**" in d2
    if flat:
        assert f"never reached {CROSS:g} steps up to {top} new tokens ({two.sixteen.cost.ratios[-1]:.2f} at {top})" in d2
    else:
        assert f"16-bit weights crossed {CROSS:g} steps at about **{two.sixteen.crossing():.1f} new tokens**" in d2
    d5 = view.words(two, "d5")
    assert f"c = {two.four.c:.2f} beside the 4-bit target and {two.sixteen.c:.2f}" in d5
    (g4, x4), (g16, x16) = two.four.best(0.8), two.sixteen.best(0.8)
    assert f"best γ is **{g4}** (expected **{x4:.2f}×**" in view.best_words(two, 0.8) and f"**{g16}** (**{x16:.2f}×**)" \
        in view.best_words(two, 0.8)
    table = view.table(two, 0.8)
    assert list(table["best γ"]) == [str(g4), str(g16)]
    assert (table["crosses 1.5 steps at"][1] == "not within 16") == flat
    answer = predict_view.reveal_precision(view.cheaper_to_check(two, top), two.four.steps_at(top),
                                           two.sixteen.steps_at(top), top)
    assert (answer.right == "The 16-bit one") == flat and f"{two.four.steps_at(top):.2f} of its own steps" in answer.measured


def test_a_tie_within_a_tenth_is_about_the_same(two) -> None:
    flat = replace(two, four=replace(two.four, cost=two.sixteen.cost))
    assert view.cheaper_to_check(flat) is None
    assert "about the same share" in view.words(flat, "d1")
    assert predict_view.reveal_precision(None, 1.2, 1.2, 16).right == "About the same"


def test_figure_has_both_curves_the_line_and_the_crossings(two) -> None:
    fig = view.figure(two, "d2")
    names = [t.name for t in fig.data]
    assert view.NAMES["d2"][0] in names and view.NAMES["d2"][1] in names and "1.5 steps" in names
    marks = [t.x[0] for t in fig.data if t.showlegend is False]
    assert marks == pytest.approx([two.four.crossing(), two.sixteen.crossing()])
    flat = [t.x[0] for t in view.figure(flat_sixteen(two), "d2").data if t.showlegend is False]
    assert flat == pytest.approx([two.four.crossing()]), "no mark where a curve never reaches the line"


def test_a_target_without_blocks_is_refused_in_one_line() -> None:
    from specviz import models

    pair = models.load_pair("tiny-random")
    with pytest.raises(precisions.PrecisionError, match="needs the gguf precision"):
        precisions.check_room(pair.target)


@pytest.mark.real
def test_the_sixteen_bit_copy_is_the_fp16w_targets_arithmetic_on_the_same_values(qwen_pair) -> None:
    """The copy's layers hold each block value rounded to fp16 (what the fp16w cache stores) on the fp16 kernel; the
    loaded target is untouched, and the copy gives a one-token pass the same logits alone and in a 5-row pass."""
    from specviz.models import blocks, half

    target = qwen_pair.target
    before = [id(m) for _, _, m in precisions.block_layers(target)]
    twin = precisions.sixteen_bit_twin(target)
    assert [id(m) for _, _, m in precisions.block_layers(target)] == before and not precisions.block_layers(twin)
    src, copy_ = target.model.layers[3].mlp.down_proj, twin.model.layers[3].mlp.down_proj
    assert isinstance(src, blocks.BlockLinear) and isinstance(copy_, half.HalfLinear)
    assert torch.equal(copy_.unpacked_weight(), src.rows(torch.arange(src.out_features)).half().float())
    embed, twin_embed = target.model.embed_tokens, twin.model.embed_tokens
    assert twin_embed.blocks.data_ptr() == embed.blocks.data_ptr(), "every other tensor is shared, not copied"
    assert twin.model.norm.weight is target.model.norm.weight
    from specviz.core.kv import CachedLM

    ids = qwen_pair.tokenizer("def add(a, b):")["input_ids"]
    alone, lm = CachedLM(twin), CachedLM(twin)
    alone.logits(ids, 1), lm.logits(ids, 1)  # the same prompt in each cache, then a verify-like pass
    one = alone.logits(ids + [11], 1)[0]
    five = lm.logits(ids + [11, 12, 13, 14, 15], 5)[0]
    assert torch.equal(one, five), "a row's bits do not depend on the rows beside it"
