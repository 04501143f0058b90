"""The GPU estimate: the shipped H200 costs read back, and a run's rounds replayed at them (hand-made rounds)."""

from types import SimpleNamespace as NS

import pytest

from specviz.bench import gpu
from specviz.viz import watch as watch_view

COSTS = gpu.GpuCosts("GPU", "bf16", 3, target_step_ms=20.0, draft_step_ms=16.0, head_step_ms={1: 1.0, 4: 1.5, 8: 2.0},
                     verify_ms={1: 20.0, 4: 21.0, 8: 22.0}, tree_verify_ms={8: 23.0, 16: 24.0})


def _chain(k: int, n_accepted: int) -> NS:
    return NS(draft_ids=tuple(range(k)), tree=None, new_ids=tuple(range(n_accepted + 1)))


def _tree(depths: list[int], n_accepted: int) -> NS:
    nodes = tuple(NS(depth=d) for d in depths)
    return NS(draft_ids=tuple(range(len(depths))), tree=NS(nodes=nodes), new_ids=tuple(range(n_accepted + 1)))


def test_chain_rounds_cost_their_draft_calls_and_one_pass():
    gen = NS(rounds=(_chain(3, 3), _chain(3, 0)))  # 4 + 1 tokens
    # each round: 3 head steps (3 ms) + a pass of 4 tokens (21 ms)
    assert gpu.expected_speedup(gen, COSTS, "head") == pytest.approx(5 * 20.0 / (2 * 24.0))
    # the draft model: 3 × 16 ms + 21 ms a round
    assert gpu.expected_speedup(gen, COSTS, "model") == pytest.approx(5 * 20.0 / (2 * 69.0))
    assert gpu.expected_speedup(gen, COSTS, "free") == pytest.approx(5 * 20.0 / (2 * 21.0))
    remembered = NS(**{**vars(_chain(3, 3)), "helper": "memory"})  # a hybrid's memory round calls no model
    assert gpu.expected_speedup(NS(rounds=(remembered,)), COSTS, "model") == pytest.approx(4 * 20.0 / 21.0)


def test_tree_rounds_cost_one_call_per_level_and_one_pass_of_every_node():
    gen = NS(rounds=(_tree([1, 1, 1, 2, 2, 3, 3, 3, 3], 3), NS(draft_ids=(), tree=None, new_ids=(0,))))
    # levels of 3, 2 and 4 nodes: 1.5 + 1.5 + 1.5 ms; 9 nodes: the 16-node pass (24 ms); then a plain step (20 ms)
    assert gpu.expected_speedup(gen, COSTS, "head") == pytest.approx(5 * 20.0 / (4.5 + 24.0 + 20.0))
    assert gpu.expected_speedup(NS(rounds=()), COSTS, "head") is None


def test_the_shipped_h200_costs_are_costs_only_and_the_line_says_where_each_part_was_measured():
    raw = (gpu.FIGURES).read_text(encoding="utf-8")
    for invalid in ("\"alpha", "speedup", "\"accept"):  # random weights there: no acceptance and no speed-up
        assert invalid not in raw
    costs = gpu.load_costs()
    assert costs is not None and costs.runs == 3 and "H200" in costs.device
    assert costs.c_head < 0.1 < costs.c_draft  # the recorded figures: the head is cheap there, the draft model is not
    line = watch_view.head_gpu_line(costs, [("this run", "head chain", 1.8)])
    assert "measured there" in line and "acceptance here" in line and "about 1.80×" in line
    assert "not been measured" in watch_view.head_gpu_line(None)
    assert gpu.load_costs(gpu.FIGURES.with_name("absent.json")) is None
