"""What a run's rounds would cost on an NVIDIA H200: step and pass costs measured there, combined with a run made here.

The GPU figures (`assets/head_cost_gpu.json`, written by `benchmarks/gpu_head_cost.py` on a lent H200) are
costs only: the models there had random weights in the qwen-coder shapes, because the real weights do
not travel to that machine. What a run accepts is measured here, on real weights. So a run's rounds are
replayed on the GPU's clock: each round costs its sequential draft calls (a chain: one per guessed token;
a tree: one per level, the level's nodes in one call) plus one verify pass of the tokens it checked, and
the speed-up is the target's own steps for the same tokens divided by that.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from specviz.core import drafters
from specviz.core.trace import MEMORY_HELPER, Generation

FIGURES = Path(__file__).resolve().parents[2] / "assets" / "head_cost_gpu.json"
PAIR = "qwen-coder"  # the pair whose shapes were measured there


@dataclass(frozen=True)
class GpuCosts:
    """Median ms over the recorded runs, for one precision."""

    device: str
    precision: str
    runs: int
    target_step_ms: float
    draft_step_ms: float  # the 0.5B draft model's one-token step
    head_step_ms: Mapping[int, float]  # the head's step for 1, 4, 8 pairs in one call
    verify_ms: Mapping[int, float]  # one target pass checking k tokens (a chain)
    tree_verify_ms: Mapping[int, float]  # one target pass over a tree of n nodes (and its root row)

    @property
    def c_head(self) -> float:
        return self.head_step_ms[1] / self.target_step_ms

    @property
    def c_draft(self) -> float:
        return self.draft_step_ms / self.target_step_ms


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def costs_from(raw: Mapping, precision: str = "bf16") -> GpuCosts:
    """The per-figure medians over every recorded run of one precision."""
    runs = [r[precision] for r in raw["runs"]]

    def table(name: str) -> dict[int, float]:
        return {int(k): _median([r[name][k] for r in runs]) for k in runs[0][name]}

    return GpuCosts(raw["device"], precision, len(runs), _median([r["target_step_ms"] for r in runs]),
                    _median([r["draft_step_ms"] for r in runs]), table("head_step_ms"), table("verify_ms"),
                    table("tree_verify_ms"))


def load_costs(path: Path = FIGURES, precision: str = "bf16") -> GpuCosts | None:
    """The shipped GPU figures (None when the file is absent: no GPU has been lent to measure them)."""
    if not path.exists():
        return None
    return costs_from(json.loads(path.read_text(encoding="utf-8")), precision)


def _at(table: Mapping[int, float], n: int) -> float:
    """The figure for n from the smallest measured size >= n (the largest when n is past them all: passes are flat there)."""
    keys = sorted(table)
    return table[next((k for k in keys if k >= n), keys[-1])]


def round_ms(rnd, costs: GpuCosts, helper: str) -> float:
    """One round of a run on the GPU's clock: its draft calls (helper "head", "model" or "free": a lookup in text,
    no model call) and its verify pass."""
    if not rnd.draft_ids:
        return costs.target_step_ms  # a plain target step
    if getattr(rnd, "helper", "") == MEMORY_HELPER:
        helper = "free"  # a hybrid's round drafted from its memory: no model call
    if rnd.tree is not None:
        widths: dict[int, int] = {}
        for node in rnd.tree.nodes:
            widths[node.depth] = widths.get(node.depth, 0) + 1
        # one call per level; a level of the draft model's is taken as one step (its calls are launch-bound there:
        # the head's, measured, cost about the same for 1 and 8 pairs)
        draft = sum(_draft_call_ms(costs, helper, w) for w in widths.values())
        return draft + _at(costs.tree_verify_ms, len(rnd.tree.nodes))
    draft = 0.0 if helper == "free" else len(rnd.draft_ids) * _draft_call_ms(costs, helper, 1)
    return draft + _at(costs.verify_ms, len(rnd.draft_ids) + 1)


def _draft_call_ms(costs: GpuCosts, helper: str, width: int) -> float:
    return {"head": _at(costs.head_step_ms, width), "model": costs.draft_step_ms}.get(helper, 0.0)


def helper_kind(needs_head: bool, needs_draft_model: bool) -> str:
    """How a drafter's calls are costed here: "head", "model", or "free" (a lookup in text)."""
    return "head" if needs_head else "model" if needs_draft_model else "free"


def expected_for(gen: Generation, costs: GpuCosts, drafter: str) -> float | None:
    """`expected_speedup` for a run of the named drafter (its calls costed as the registry says it drafts)."""
    kind = drafters.spec(drafter)
    return expected_speedup(gen, costs, helper_kind(kind.needs_head, kind.needs_draft_model))


def expected_speedup(gen: Generation, costs: GpuCosts, helper: str) -> float | None:
    """The run's tokens at one target step each, over its rounds replayed on the GPU's costs (None: no rounds)."""
    if not gen.rounds:
        return None
    tokens = sum(len(r.new_ids) for r in gen.rounds)
    return tokens * costs.target_step_ms / sum(round_ms(r, costs, helper) for r in gen.rounds)
