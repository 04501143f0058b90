"""Which helper wins? The lab on the tiny pair (its shipped head included), its figure, table and words."""

from types import SimpleNamespace

import pytest

from specviz import models
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.labs import helpers
from specviz.viz import helpers as view


@pytest.fixture(scope="module")
def result():
    pair = models.load_pair("tiny-random")
    cfg = helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"), max_new_tokens=8)
    return drain(helpers.helpers_steps(pair, cfg))


def test_every_helper_runs_on_every_preset_and_keeps_the_targets_tokens(result):
    assert len(result.points) == len(helpers.PRESETS) * len(helpers.HELPERS)
    assert all(p.identical for p in result.points)  # greedy: each helper's run is the target's own text
    assert all(p.speedup is not None and p.tokens_per_call >= 1 for p in result.points)
    eagle = [p for p in result.points if p.helper == "eagle"]
    assert all(p.c is not None and p.alpha is not None for p in eagle)  # the head drafted and was timed
    for preset in helpers.PRESETS:
        best = result.winner(preset)
        assert best.speedup == max(p.speedup for p in result.points if p.preset == preset)


def test_the_figure_table_and_verdict_come_from_the_runs(result):
    fig = view.helpers_figure(result, "d2")
    assert [t.name for t in fig.data] == [view.helper_name(h, "d2") for h in helpers.HELPERS]
    assert all(len(t.y) == len(helpers.PRESETS) for t in fig.data)
    table = view.helpers_table(result, "d5")
    assert len(table) == len(result.points) and "c (guess cost ÷ target step)" in table.columns
    words = view.verdict(result, "d5")
    assert words.count("- **") == len(helpers.PRESETS)
    for preset, line in zip(helpers.PRESETS, words.splitlines()):
        lead = result.leaders(preset)  # a winner only beyond the margin, else "about the same"
        assert view.preset_title(preset) in line and f"{lead[0].speedup:.2f}×" in line
        assert ("about the same:" in line) == (len(lead) > 1) and ("fastest:" in line) == (len(lead) == 1)
    assert "times as fast" in view.verdict(result, "d1")


def _point(preset: str, helper: str, speedup: float) -> helpers.HelperPoint:
    return helpers.HelperPoint(preset, helper, 0.8, 0.1, 2.0, speedup, True)


def test_a_helper_wins_only_beyond_the_margin():
    cfg = helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"))
    result = helpers.HelpersResult(cfg, (
        _point("code", "model", 1.50), _point("code", "ngram", 1.45), _point("code", "eagle", 1.0),
        _point("story", "model", 1.50), _point("story", "ngram", 1.20)))
    assert [p.helper for p in result.leaders("code")] == ["model", "ngram"]  # 3 % apart: about the same
    assert [p.helper for p in result.leaders("story")] == ["model"]  # 25 % ahead: a winner
    d2, d1 = view.verdict(result, "d2"), view.verdict(result, "d1")
    assert "about the same: draft model and prompt lookup (1.45× to 1.50×" in d2 and "fastest: draft model, 1.50×" in d2
    assert "too close to name a winner" in d1 and "the fastest helper was the" in d1 and "1.5 times as fast" in d1


def test_helpers_a_pair_cannot_run_are_named_and_left_out():
    bare = SimpleNamespace(draft=None, head=None, head_problem="")
    ok, missing = helpers.available(bare)
    assert ok == ("ngram",) and len(missing) == 3 and any("ships no trained head" in m for m in missing)
    with pytest.raises(ValueError, match="unknown drafter"):
        helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"), helpers=("oracle",))


def test_the_table_is_rounded_as_it_is_read():
    cfg = helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"))
    raw = helpers.HelpersResult(cfg, (helpers.HelperPoint("code", "model", 0.833333, 0.123456, 10.666667, 1.456789, True),))
    row = view.helpers_table(raw, "d5").iloc[0]
    assert row["tokens / target call"] == 10.67 and row["speed-up"] == 1.46 and row["α (accepted ÷ checked)"] == 0.83
