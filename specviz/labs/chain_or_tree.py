"""Chain or tree? The same number of verified tokens spent on one line of guesses or on a tree of them, measured on a
predictable and a creative preset."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from specviz.settings import encode_prompt
from specviz.core import metrics
from specviz.models import drafting
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.limits import GAMMA_RANGE
from specviz.core.progress import Progress, with_progress
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import Generation, GenerationConfig
from specviz.core.drafters.tree import BRANCHING_RANGE, DEPTH_RANGE, TreeConfig
from specviz.presets import get_preset

PRESETS = ("code", "story")  # predictable (the draft is sure for many tokens) and creative (it often is not)
SIZE_CHOICES = (2, 4, 8, 12, 16)  # drafted tokens the target verifies per pass (chain γ = tree budget)
DEFAULT_SIZES = (4, 8, 16)
MAX_NEW = 32  # per run: 2 presets × (1 + 2 × 3 sizes) runs take about 2 minutes for qwen-coder on this 2-core CPU
SHAPES = ("chain", "tree")


@dataclass(frozen=True)
class ShapeConfig:
    """One measurement of the section; frozen plain values, so it is the runner's job key."""

    pair: str
    sizes: tuple[int, ...]  # verified drafted tokens per pass, sorted and unique
    sampling: SamplingConfig  # the sidebar's decoding, for every run
    presets: tuple[str, ...] = PRESETS
    max_new_tokens: int = MAX_NEW
    branching: int = 2  # the tree's children per expanded node
    helper: str = drafters.DEFAULT  # who guesses: a chain kind whose helper also drafts trees (drafters.shape_pairs)

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("choose at least one size to measure")
        if tuple(sorted(set(self.sizes))) != self.sizes:
            raise ValueError(f"sizes must be sorted and unique, got {self.sizes}")
        lo, hi = GAMMA_RANGE
        for n in self.sizes:
            if not lo <= n <= min(hi, DEPTH_RANGE[1]):
                raise ValueError(f"a size must be in {lo}..{min(hi, DEPTH_RANGE[1])}, got {n}")
        if not BRANCHING_RANGE[0] < self.branching <= BRANCHING_RANGE[1]:
            raise ValueError(f"tree branching must be in 2..{BRANCHING_RANGE[1]}, got {self.branching}")
        chains = [chain for chain, _ in drafters.shape_pairs()]
        if self.helper not in chains:
            raise ValueError(f"helper must be one of {', '.join(chains)}, got {self.helper!r}")
        for p in self.presets:
            if get_preset(p) is None:
                raise ValueError(f"unknown preset {p!r}")

    def chain(self, n: int) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=n, sampling=self.sampling)

    def tree(self, n: int) -> TreeConfig:
        """n nodes, every one verified (no pruning: the same count as the chain), as deep as the chain may go."""
        return TreeConfig(budget=n, branching=self.branching, depth=n, min_score=0.0)

    @property
    def runs(self) -> int:
        return len(self.presets) * (1 + len(SHAPES) * len(self.sizes))


def make_config(pair: str, sizes: Sequence[int], sampling: SamplingConfig, helper: str = drafters.DEFAULT) -> ShapeConfig:
    """A ShapeConfig with the sizes sorted and de-duplicated (a multiselect gives them in click order)."""
    return ShapeConfig(pair, tuple(sorted({int(n) for n in sizes})), sampling, helper=helper)


def helper_for(drafter: str) -> str:
    """The helper the sidebar's drafter implies (its chain kind), where it drafts both shapes; else the default's."""
    both = drafters.chain_and_tree(drafter) or drafters.chain_and_tree(drafters.DEFAULT)
    assert both is not None  # the default helper drafts both shapes
    return both[0]


def why_not(pair: Any, helper: str) -> str | None:
    """Why this pair cannot compare the helper's chain and tree, or None when it can."""
    chain, tree = drafters.chain_and_tree(helper)  # type: ignore[misc]  # a ShapeConfig's helper drafts both
    return drafting.why_not(chain, pair) or drafting.why_not(tree, pair)


@dataclass(frozen=True)
class ShapePoint:
    """One speculative run: a preset, a size, a shape."""

    preset: str
    size: int
    shape: str  # "chain" or "tree"
    tokens_per_call: float | None  # new tokens per target pass
    nodes_per_pass: float  # drafted tokens verified per pass (the chain's γ, the tree's nodes; EOS or the end cut some)
    speedup: float | None  # this preset's target alone ÷ this run, ms per token (decode only)
    identical: bool | None  # greedy only: the target's own tokens


@dataclass(frozen=True)
class ShapeResult:
    config: ShapeConfig
    baseline_ms_per_token: dict[str, float]  # by preset
    points: tuple[ShapePoint, ...]

    def point(self, preset: str, size: int, shape: str) -> ShapePoint | None:
        return next((p for p in self.points if (p.preset, p.size, p.shape) == (preset, size, shape)), None)

    def tree_wins(self, preset: str) -> tuple[int, int]:
        """(sizes where the tree gave more tokens per target call than the chain, sizes compared) on one preset."""
        pairs = [(self.point(preset, n, "chain"), self.point(preset, n, "tree")) for n in self.config.sizes]
        scored = [(c, t) for c, t in pairs if c and t and c.tokens_per_call is not None and t.tokens_per_call is not None]
        return sum(t.tokens_per_call > c.tokens_per_call for c, t in scored), len(scored)


def _point(preset: str, size: int, shape: str, gen: Generation, baseline: Generation) -> ShapePoint:
    cmp = metrics.compare(gen, baseline)
    return ShapePoint(preset, size, shape, cmp.tokens_per_target_call, cmp.gamma, cmp.speedup, cmp.identical)


def shape_steps(pair: Any, config: ShapeConfig) -> Generator[Progress, None, ShapeResult]:
    """The runner job: per preset the target alone, then a chain and a tree run at every size."""
    if (problem := why_not(pair, config.helper)) is not None:
        raise ValueError(problem)
    chain_kind, tree_kind = drafters.chain_and_tree(config.helper)  # type: ignore[misc]  # checked by the config
    budget, eos, total = config.max_new_tokens, tuple(pair.eos_ids), config.max_new_tokens * config.runs
    done, base_ms, points = 0, {}, []
    for preset in config.presets:
        ids = encode_prompt(pair.tokenizer, get_preset(preset).prompt)
        yield Progress(done, total, f"{preset}: target alone…")
        baseline = yield from with_progress(
            autoregressive_generate(pair.target, pair.tokenizer, ids, config.chain(GAMMA_RANGE[0]), eos),
            done, total, f"{preset}: target alone", budget)
        base_ms[preset] = baseline.ms_per_token
        done += budget
        for n in config.sizes:
            for shape in SHAPES:
                drafter = drafting.resolve(tree_kind if shape == "tree" else chain_kind, pair,
                                           tree=config.tree(n) if shape == "tree" else None)
                gen = yield from with_progress(
                    speculative_generate(pair.target, drafter, pair.tokenizer, ids, config.chain(n), eos),
                    done, total, f"{preset}: {shape} of {n}", budget)
                points.append(_point(preset, n, shape, gen, baseline))
                done += budget
    yield Progress(total, total, f"all {config.runs} runs done")
    return ShapeResult(config, base_ms, tuple(points))
