"""metrics.compare: one record, two acceptances never mixed, a c robust to one cold round, the first divergence."""

from __future__ import annotations

import pytest

from specviz.core import metrics
from specviz.core.divergence import Divergence, first_divergence
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import Generation, GenerationConfig, RoundTrace


def _round(k: int, n: int, draft_ms: float = 0.0, verify_ms: float = 10.0, next_id: int = 2) -> RoundTrace:
    return RoundTrace(
        index=0, position=0, draft_ids=(1,) * k, draft_texts=("a",) * k, p_draft=(0.5,) * k, q_draft=(0.5,) * k,
        accept_probs=(1.0,) * k, uniforms=(0.1,) * k, accepted=tuple(i < n for i in range(k)), n_accepted=n,
        next_id=next_id, next_text="b", next_origin="target" if k == 0 else "correction", p_top=None, q_top=None,
        residual_top=None, draft_ms=draft_ms, verify_ms=verify_ms,
    )


def _gen(rounds: list[RoundTrace], tokens: tuple[int, ...], decode_ms: float, gamma: int = 4,
         mode: str = "greedy", kind: str = "speculative") -> Generation:
    cfg = GenerationConfig(max_new_tokens=64, gamma=gamma, sampling=SamplingConfig(mode, temperature=1.0))
    return Generation(kind=kind, drafter="model" if kind == "speculative" else "none", config=cfg, prompt_ids=(0,),
                      tokens=tokens, text="", rounds=tuple(rounds), prefill_ms=0.0, decode_ms=decode_ms,
                      stop_reason="max_new_tokens")


def _baseline(n: int = 12, step_ms: float = 50.0, tokens: tuple[int, ...] | None = None) -> Generation:
    return _gen([_round(0, 0, 0.0, step_ms)] * n, tokens or tuple(range(n)), n * step_ms, kind="autoregressive")


def test_the_two_acceptances_have_distinct_names_and_values():
    rounds = [_round(4, 2, 8.0, 80.0), _round(4, 4, 8.0, 80.0), _round(4, 0, 8.0, 80.0)]
    cmp = metrics.compare(_gen(rounds, tuple(range(9)), 300.0), _baseline())
    assert cmp.acceptance_drafted == pytest.approx(6 / 12)  # accepted ÷ drafted
    assert cmp.alpha_checked == pytest.approx(6 / 8)  # accepted ÷ checked: 6 + two first rejections
    assert not hasattr(cmp, "acceptance_rate") and not hasattr(cmp, "alpha")  # no ambiguous name to mix up
    # Leviathan's formula is fed the checked α, never the drafted acceptance
    assert cmp.expected_speedup == pytest.approx(metrics.expected_speedup(6 / 8, 4, cmp.c))
    assert cmp.expected_speedup != pytest.approx(metrics.expected_speedup(6 / 12, 4, cmp.c))


def test_c_is_robust_to_one_slow_cold_round():
    typical = [_round(4, 3, 4 * 7.0, 80.0) for _ in range(9)]  # 7 ms per drafted token
    cold = _round(4, 3, 4 * 230.0, 80.0)  # the first draft pays one-off costs: 230 ms per token
    spec = _gen([cold] + typical, tuple(range(40)), 1000.0)
    cmp = metrics.compare(spec, _baseline(step_ms=70.0))
    assert cmp.target_step_ms == pytest.approx(70.0)
    assert cmp.draft_ms_per_token == pytest.approx(7.0)
    assert cmp.c == pytest.approx(0.1)  # the mean would give (230 + 9·7)/10/70 ≈ 0.42
    # a slow baseline step does not move the target step either (median of the baseline's rounds)
    hiccup = _gen([_round(0, 0, 0.0, 70.0)] * 11 + [_round(0, 0, 0.0, 900.0)], tuple(range(12)), 1670.0,
                  kind="autoregressive")
    assert metrics.compare(spec, hiccup).c == pytest.approx(0.1)


def test_speedups_measured_textbook_and_with_the_measured_verify_cost():
    # verify of a 5-token pass costs 2 target steps (100 ms vs 50 ms)
    rounds = [_round(4, 4, 4 * 5.0, 100.0)] * 8
    spec = _gen(rounds, tuple(range(40)), 960.0)
    base = _baseline(n=40, step_ms=50.0)
    cmp = metrics.compare(spec, base)
    assert cmp.speedup == pytest.approx((40 * 50.0 / 40) / (960.0 / 40))
    assert cmp.c == pytest.approx(0.1)
    assert cmp.tokens_per_target_call == pytest.approx(5.0)
    assert cmp.verify_steps == pytest.approx(2.0)
    a = 1.0
    assert cmp.expected_speedup == pytest.approx(metrics.expected_tokens_per_round(a, 4) / (1 + 4 * 0.1))
    assert cmp.expected_speedup_measured_verify == pytest.approx(metrics.expected_tokens_per_round(a, 4) / (2 + 4 * 0.1))
    # the how-far curve with a fit is the same formula
    fit = metrics.verify_fit_of(base, rounds)
    assert metrics.speedup_with_verify_cost(a, 4, 0.1, fit) == pytest.approx(cmp.expected_speedup_measured_verify)


def test_without_a_baseline_only_the_run_own_figures():
    cmp = metrics.compare(_gen([_round(4, 1, 4.0)], (1, 2), 10.0))
    assert cmp.acceptance_drafted == pytest.approx(0.25) and cmp.alpha_checked == pytest.approx(0.5)
    assert cmp.c is None and cmp.speedup is None and cmp.expected_speedup is None and cmp.identical is None
    assert cmp.divergence is None and cmp.first_divergence is None


def test_greedy_identity_and_first_divergence_with_both_tokens():
    base = _baseline(n=6, tokens=(5, 6, 7, 8, 9, 10))
    same = metrics.compare(_gen([_round(4, 4)], (5, 6, 7, 8, 9, 10), 10.0), base)
    assert same.identical is True and same.divergence is None
    differ = metrics.compare(_gen([_round(4, 4)], (5, 6, 99, 8, 9, 10), 10.0), base)
    assert differ.identical is False
    assert differ.divergence == Divergence(2, 99, 7) and differ.first_divergence == 2
    shorter = first_divergence((5, 6), (5, 6, 7))
    assert shorter == Divergence(2, None, 7)
    assert first_divergence((1, 2), (1, 2)) is None
    sampled = metrics.compare(_gen([_round(4, 4)], (1,), 10.0, mode="sample"), base)
    assert sampled.identical is None and sampled.divergence is None  # sampled runs are not token-comparable


def test_effective_gamma_is_mean_drafted_when_drafts_vary():
    fixed = _gen([_round(4, 1), _round(2, 2)], (1,), 1.0)
    assert metrics.compare(fixed).gamma == 4.0
    adaptive = Generation(**{**fixed.__dict__, "config": GenerationConfig(gamma=16, adaptive=True)})
    assert metrics.compare(adaptive).gamma == pytest.approx(3.0)


def test_a_tree_run_counts_its_nodes_as_gamma_and_gets_no_chain_formula():
    """A tree's γ is its mean node count (not the chain setting), and Leviathan's chain formula is not applied to it."""
    from dataclasses import replace

    rounds = [_round(16, 5, 6 * 30.0, 150.0), _round(12, 3, 6 * 30.0, 140.0)]
    tree = replace(_gen(rounds, tuple(range(10)), 700.0), drafter="tree")
    cmp = metrics.compare(tree, _baseline())
    assert cmp.gamma == pytest.approx(14.0)
    assert cmp.expected_speedup is None and cmp.expected_speedup_measured_verify is None
    assert cmp.tokens_per_target_call == pytest.approx(5.0) and cmp.speedup is not None
    chain = metrics.compare(_gen(rounds, tuple(range(10)), 700.0), _baseline())  # the same rounds drawn as a chain
    assert chain.expected_speedup is not None


def test_acceptance_by_position_counts_as_vllm_does():
    """Per position k: drafting rounds whose k-th guess was accepted ÷ drafting rounds (short drafts miss at k)."""
    rounds = [_round(4, 2), _round(4, 4), _round(2, 1), _round(0, 0)]  # the target-only step is not a drafting round
    shares = metrics.acceptance_by_position(rounds)
    assert shares == pytest.approx((3 / 3, 2 / 3, 1 / 3, 1 / 3))
    assert all(a >= b for a, b in zip(shares, shares[1:]))  # a later guess pays only if all before it did
    assert metrics.acceptance_by_position([_round(0, 0)]) == ()
    assert metrics.compare(_gen(rounds, tuple(range(10)), 100.0)).acceptance_by_position == shares


def test_acceptance_by_position_of_a_tree_follows_its_accepted_path():
    from specviz.core.trace import TreeNode, TreeTrace

    def node(parent: int, depth: int, verdict: str) -> TreeNode:
        return TreeNode(token=1, text="a", parent=parent, depth=depth, p=0.5, q=0.5, sampled=False,
                        accept_prob=1.0, uniform=0.1, verdict=verdict)  # type: ignore[arg-type]

    # five nodes three deep; the accepted path is two long (root's child, then its child)
    nodes = (node(-1, 1, "accepted"), node(-1, 1, "unreached"), node(0, 2, "accepted"), node(2, 3, "rejected"),
             node(1, 2, "unreached"))
    tree = TreeTrace(nodes=nodes, path=(0, 2))
    r = _round(5, 2)
    tree_round = RoundTrace(**{**r.__dict__, "tree": tree})
    assert metrics.draft_depth(tree_round) == 3 and metrics.draft_depth(r) == 5
    assert metrics.acceptance_by_position([tree_round, _round(1, 0)]) == pytest.approx((0.5, 0.5, 0.0))
