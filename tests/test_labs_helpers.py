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
    assert words.count("- **") == len(helpers.PRESETS) and "fastest:" in words
    assert "sooner" in view.verdict(result, "d1")


def test_helpers_a_pair_cannot_run_are_named_and_left_out():
    bare = SimpleNamespace(draft=None, head=None, head_problem="")
    ok, missing = helpers.available(bare)
    assert ok == ("ngram",) and len(missing) == 3 and any("ships no trained head" in m for m in missing)
    with pytest.raises(ValueError, match="unknown drafter"):
        helpers.HelpersConfig("tiny-random", SamplingConfig("greedy"), helpers=("oracle",))
