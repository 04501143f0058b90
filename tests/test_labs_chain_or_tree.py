"""The chain-or-tree lab: its config, and one real job on the tiny pair (the page test draws it)."""

import pytest

from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.labs.chain_or_tree import ShapeConfig, make_config, shape_steps
from specviz.models import load_pair

GREEDY = SamplingConfig("greedy")


@pytest.mark.parametrize("sizes, bad", [((), "at least one"), ((8, 4), "sorted"), ((0,), "size must be"),
                                        ((17,), "size must be")])
def test_config_refuses_bad_sizes(sizes, bad):
    with pytest.raises(ValueError, match=bad):
        ShapeConfig("tiny-random", sizes, GREEDY)


def test_the_tree_verifies_as_many_nodes_as_the_chain_guesses():
    cfg = make_config("tiny-random", [8, 4, 8], GREEDY)
    assert cfg.sizes == (4, 8) and cfg.runs == 2 * (1 + 2 * 2)
    tree = cfg.tree(8)
    assert (tree.budget, tree.depth, tree.min_score) == (8, 8, 0.0)  # no pruning: the same n verified
    assert cfg.chain(8).gamma == 8


def test_a_job_measures_every_preset_size_and_shape_and_keeps_greedy_identical():
    pair = load_pair("tiny-random")
    result = drain(shape_steps(pair, make_config("tiny-random", [3, 6], GREEDY)))
    assert set(result.baseline_ms_per_token) == {"code", "story"}
    assert len(result.points) == 2 * 2 * 2
    for p in result.points:
        assert p.identical is True and p.tokens_per_call is not None and p.tokens_per_call >= 1.0
        # a chain verifies n drafted tokens per pass; the tree n nodes (fewer only where the run's end cut a round)
        assert 0 < p.nodes_per_pass <= p.size
    wins, compared = result.tree_wins("story")
    assert compared == 2 and 0 <= wins <= 2
