"""How far to guess: α per checked position, Leviathan's curves, the verify-cost fit, the γ sweep and its chart."""

from __future__ import annotations

import random

import plotly.graph_objects as go
import pytest

from specviz.labs import how_far
from specviz.core import metrics
from specviz import models
from specviz.core.trace import RoundTrace
from specviz.core.progress import Progress, drain
from specviz.presets import get_preset
from specviz.core.sampling import SamplingConfig
from specviz.viz import how_far as how_far_view


def _round(k: int, n: int, draft_ms: float = 1.0, verify_ms: float = 10.0) -> RoundTrace:
    return RoundTrace(
        index=0, position=0, draft_ids=(1,) * k, draft_texts=("a",) * k, p_draft=(0.5,) * k, q_draft=(0.5,) * k,
        accept_probs=(1.0,) * k, uniforms=(0.1,) * k, accepted=tuple(i < n for i in range(k)), n_accepted=n,
        next_id=2, next_text="b", next_origin="target" if k == 0 else "correction", p_top=None, q_top=None,
        residual_top=None, draft_ms=draft_ms, verify_ms=verify_ms,
    )


# ---------------------------------------------------------------------------------------------
# α per checked position (metrics.alpha_checked)


def test_alpha_checked_counts_only_checked_positions():
    rounds = [_round(4, 2), _round(4, 4), _round(2, 0), _round(0, 0)]
    # accepted 2 + 4 + 0 = 6; checked = 6 + two first rejections (rounds 1 and 3); round 2 had none; k = 0 adds nothing
    assert metrics.alpha_checked(rounds) == pytest.approx(6 / 8)
    assert metrics.acceptance_drafted(rounds) == pytest.approx(6 / 10)
    assert metrics.alpha_checked([]) is None and metrics.alpha_checked([_round(0, 0)]) is None


@pytest.mark.parametrize("alpha", [0.5, 0.8, 0.95])
def test_alpha_checked_recovers_alpha_at_every_gamma_while_drafted_ratio_falls(alpha):
    rng = random.Random(7)

    def simulate(gamma: int) -> list[RoundTrace]:
        out = []
        for _ in range(4000):
            n = 0
            while n < gamma and rng.random() < alpha:
                n += 1
            out.append(_round(gamma, n))
        return out

    drafted_ratio = []
    for gamma in (1, 4, 12):
        rounds = simulate(gamma)
        assert metrics.alpha_checked(rounds) == pytest.approx(alpha, abs=0.02)
        drafted_ratio.append(metrics.acceptance_drafted(rounds))
        # and the measured tokens per round follow Leviathan's expectation
        assert metrics.tokens_per_target_call(rounds) == pytest.approx(
            metrics.expected_tokens_per_round(alpha, gamma), rel=0.03)
    assert drafted_ratio[0] > drafted_ratio[1] > drafted_ratio[2]


# ---------------------------------------------------------------------------------------------
# curves and the verify-cost fit


def test_leviathan_curves_follow_the_formulas_and_find_the_peak():
    cv = how_far.leviathan_curves(0.8, 0.1)
    assert cv.gammas == tuple(range(1, 17))
    assert cv.tokens[3] == pytest.approx((1 - 0.8**5) / 0.2)
    assert cv.speedup[3] == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert cv.speedup[cv.best - 1] == max(cv.speedup)
    assert 1 < cv.best < 16  # a real interior optimum for these values
    assert how_far.leviathan_curves(0.3, 0.2).best == 1  # a poor, dear draft: guess once
    assert how_far.leviathan_curves(1.0, 0.01).best == 16  # a perfect, free draft: guess as far as allowed
    assert how_far.leviathan_curves(1.0, 0.0).tokens[-1] == 17


def test_verify_fit_recovers_a_straight_line_and_one_step_means_leviathan():
    step = 20.0
    rounds = [_round(0, 0, 0.0, step)] * 5  # target-only steps: 1 target step each
    rounds += [_round(k, k, 1.0, step * (0.5 + 0.5 * (k + 1))) for k in (1, 3, 7) for _ in range(3)]
    sizes = metrics.verify_steps_by_size(rounds, step)
    assert sizes == pytest.approx({1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5})
    fit = metrics.fit_verify_cost(sizes)
    assert fit.intercept == pytest.approx(0.5) and fit.slope == pytest.approx(0.5) and fit.max_scored == 8
    assert metrics.fit_verify_cost({1: 1.0}) is None
    flat = metrics.VerifyFit(1.0, 0.0, 1)
    for g in (1, 4, 16):
        assert metrics.speedup_with_verify_cost(0.7, g, 0.05, flat) == pytest.approx(metrics.expected_speedup(0.7, g, 0.05))
    # a dearer verify pass lowers the prediction
    assert metrics.speedup_with_verify_cost(0.7, 4, 0.05, fit) < metrics.expected_speedup(0.7, 4, 0.05)


def test_sweep_config_sorts_gammas_and_rejects_bad_ones():
    cfg = how_far.make_sweep_config("tiny-random", "x", "model", [8, 1, 4, 1], 16, SamplingConfig())
    assert cfg.gammas == (1, 4, 8) and cfg.runs == 4
    assert cfg.spec_config(4).gamma == 4 and not cfg.spec_config(4).adaptive
    assert cfg == how_far.make_sweep_config("tiny-random", "x", "model", [4, 8, 1], 16, SamplingConfig())
    assert hash(cfg) == hash(how_far.make_sweep_config("tiny-random", "x", "model", (1, 4, 8), 16, SamplingConfig()))
    with pytest.raises(ValueError, match="at least one"):
        how_far.make_sweep_config("tiny-random", "x", "model", [], 16, SamplingConfig())
    with pytest.raises(ValueError, match="1..16"):
        how_far.make_sweep_config("tiny-random", "x", "model", [0, 4], 16, SamplingConfig())


# ---------------------------------------------------------------------------------------------
# the sweep on the tiny random pair (real engine, no weights to load)


@pytest.fixture(scope="module")
def tiny():
    return models.load_pair("tiny-random")


def _drain(steps):
    """(every item the job yielded, its result)."""
    items = []
    return items, drain(steps, items.append)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_sweep_runs_baseline_and_every_gamma(tiny, drafter):
    prompt = get_preset("code").prompt
    ids = list(tiny.tokenizer(prompt)["input_ids"])
    cfg = how_far.make_sweep_config("tiny-random", prompt, drafter, [1, 3, 6], 24, SamplingConfig())
    progress, sweep = _drain(how_far.sweep_steps(tiny, ids, cfg))
    assert all(isinstance(p, Progress) for p in progress)
    done = [p.done for p in progress]
    assert done == sorted(done) and progress[-1].done == progress[-1].total == 24 * 4
    assert len(progress) > 2 * cfg.runs  # per round, not only per run
    assert [p.gamma for p in sweep.points] == [1, 3, 6]
    assert sweep.target_step_ms and sweep.target_step_ms > 0 and sweep.baseline_tokens >= 1
    for p in sweep.points:
        assert p.identical is True  # greedy: every γ writes exactly the target's own text
        assert p.tokens_per_round >= 1.0 and p.speedup and p.speedup > 0
        if p.acceptance is not None:
            assert 0.0 <= p.acceptance <= p.alpha <= 1.0
    if drafter == "model":
        assert sweep.c is not None and sweep.c > 0 and 0.0 <= sweep.alpha <= 1.0
        assert sweep.verify_fit is not None  # passes of 1 (baseline) and several sizes were timed
        assert all(p.verify_steps is not None for p in sweep.points)
    assert sweep.best_measured.speedup == max(p.speedup for p in sweep.points)


def test_a_repeated_sweep_takes_turns_and_judges_the_winner_by_its_own_spread(tiny):
    """Twice over, the baseline and every γ in turn: each point is the median of its rounds' speed-ups (each against
    its own round's baseline), its whisker their range, and the margin a winner needs is the widest whisker."""
    from specviz.labs import ranking
    from specviz.viz import how_far as how_far_view

    prompt = get_preset("code").prompt
    ids = list(tiny.tokenizer(prompt)["input_ids"])
    cfg = how_far.make_sweep_config("tiny-random", prompt, "model", [1, 4], 12, SamplingConfig(), repeats=2)
    progress, sweep = _drain(how_far.sweep_steps(tiny, ids, cfg))
    assert cfg.runs == 6 and progress[-1].done == progress[-1].total == 12 * 6
    order = [p.message for p in progress if p.message.endswith("…")]
    assert [m.split(";")[-1].strip() for m in order] == [
        "target alone (the baseline) (round 1 of 2)…", "next γ = 1 (round 1 of 2)…", "next γ = 4 (round 1 of 2)…",
        "target alone (the baseline) (round 2 of 2)…", "next γ = 1 (round 2 of 2)…", "next γ = 4 (round 2 of 2)…"]
    for p in sweep.points:
        assert p.repeats == 2 and p.speedup_low <= p.speedup <= p.speedup_high and p.identical is True
    spread = max(ranking.spread((p.speedup_low, p.speedup_high)) for p in sweep.points)
    assert sweep.timing_spread == pytest.approx(spread) and sweep.margin == pytest.approx(max(0.10, spread))
    assert sweep.leaders() == ranking.leaders(sweep.points, lambda p: p.speedup, sweep.margin)
    assert f"up to {spread:.0%}" in how_far_view.noise_words(sweep, "d5") and not how_far_view.noise_words(sweep, "d1")
    marks = [t for t in how_far_view.how_far_figure(None, sweep.points).data if t.error_y and t.error_y.array]
    assert len(marks) == 1 and list(marks[0].error_y.array) == pytest.approx(
        [p.speedup_high - p.speedup for p in sweep.points])
    assert "runs' speed-ups" in how_far_view.sweep_table(sweep, "d5").data


def test_the_page_sweep_runs_every_gamma_twice_at_most_32_tokens():
    from specviz.settings import Settings

    cfg = how_far.sweep_config(Settings(pair="tiny-random", max_new_tokens=64), "x", [4, 1])
    assert cfg.repeats == how_far.PAGE_REPEATS == 2 and cfg.max_new_tokens == how_far.PAGE_TOKENS == 32
    assert cfg.runs == 6 and how_far.sweep_config(Settings(pair="tiny-random", max_new_tokens=12), "x", [1]).max_new_tokens == 12


def test_sampled_sweep_is_not_checked_for_identity(tiny):
    ids = list(tiny.tokenizer("Once upon a time")["input_ids"])
    cfg = how_far.make_sweep_config("tiny-random", "Once upon a time", "model", [2], 12,
                                      SamplingConfig(mode="sample", temperature=0.9, seed=3))
    _, sweep = _drain(how_far.sweep_steps(tiny, ids, cfg))
    assert sweep.points[0].identical is None


# ---------------------------------------------------------------------------------------------
# the chart


def _point(g: int, speed: float) -> how_far.GammaPoint:
    return how_far.GammaPoint(g, 0.7, 0.8, 2.5, 0.1, speed, 100.0, 2.0, 32, True)


def test_how_far_figure_shows_curves_points_and_best_gamma():
    measured = how_far.leviathan_curves(0.8, 0.1)
    points = [_point(1, 1.2), _point(4, 1.6), _point(8, 1.3)]
    verify = how_far.verify_cost_curves(0.8, 0.1, metrics.VerifyFit(0.5, 0.4, 9))
    fig = how_far_view.how_far_figure(measured, points, None, verify, level="d5", font_size=13)
    assert isinstance(fig, go.Figure)
    names = [t.name for t in fig.data]
    assert "Leviathan, verify = 1 step" in names and "measured" in names and "Leviathan with measured verify cost" in names
    # the main curve carries the measured verify cost: its best γ is starred, the textbook curve is dashed
    stars = [t for t in fig.data if t.marker and t.marker.symbol == "star"]
    assert len(stars) == 1 and stars[0].x[0] == verify.best and verify.best < measured.best
    assert all(t.line.dash == "dash" for t in fig.data if t.name == "Leviathan, verify = 1 step")
    plain = how_far_view.how_far_figure(measured, points, None, None, level="d5")  # nothing to fit: the textbook star
    assert [t.x[0] for t in plain.data if t.marker and t.marker.symbol == "star"] == [measured.best]
    assert "Leviathan (measured α, c)" in [t.name for t in plain.data]
    crosses = [t for t in fig.data if t.mode == "markers" and t.yaxis == "y2"]
    assert list(crosses[0].x) == [1, 4, 8] and list(crosses[0].y) == [1.2, 1.6, 1.3]
    assert max(crosses[0].marker.size) == crosses[0].marker.size[1]  # the best measured γ (4) is drawn larger
    layout = fig.layout
    assert layout.yaxis.title.text == "E[tokens per round]" and "speed-up" in layout.yaxis2.title.text
    assert layout.xaxis2.title.text.startswith("γ")


def test_how_far_figure_adds_the_sliders_curve_and_d1_keeps_one_panel():
    measured = how_far.leviathan_curves(0.8, 0.1)
    custom = how_far.leviathan_curves(0.5, 0.3)
    fig = how_far_view.how_far_figure(measured, [], custom, None, level="d2")
    stars = [t for t in fig.data if t.marker and t.marker.symbol == "star"]
    assert sorted(s.x[0] for s in stars) == sorted([measured.best, custom.best])
    assert any(t.name == "expected (your α, c)" for t in fig.data)
    d1 = how_far_view.how_far_figure(measured, [_point(2, 1.4)], None, None, level="d1")
    assert "yaxis2" not in d1.layout.to_plotly_json() or d1.layout.yaxis2.title.text is None
    assert d1.layout.xaxis.title.text.startswith("how many words")
    # only the sliders (nothing measured yet)
    only = how_far_view.how_far_figure(None, [], custom, None, level="d5")
    assert [t.name for t in only.data if t.mode == "lines"] == ["Leviathan (slider α, c)"] * 2


def test_verify_cost_bars_have_units():
    fig = how_far_view.verify_cost_bars([_point(1, 1.0), _point(4, 1.5)])
    assert list(fig.data[0].x) == [1, 4] and "target step" in fig.layout.yaxis.title.text
