"""Which helper wins? The same presets guessed by each kind of helper (draft model, prompt lookup, the head's chain and
tree), measured now: α, c, tokens per target call and speed-up, each against the target alone on the same preset."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from specviz.core import drafters, metrics
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.limits import DEFAULT_GAMMA
from specviz.core.progress import Progress, with_progress
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.labs import ranking
from specviz.models import drafting
from specviz.presets import get_preset
from specviz.settings import encode_prompt

HELPERS = ("model", "ngram", "eagle", "eagle-tree")  # the draft model's chain, prompt lookup, the head's chain and tree
PRESETS = ("code", "list", "story")  # two predictable genres and a creative one
GAMMA = DEFAULT_GAMMA  # every chain guesses this many tokens a round (a tree: its default budget)
MAX_NEW = 32  # per run: 3 presets × (1 + 4 helpers) runs of 32 tokens take about 3 minutes for qwen-coder on 2 cores


@dataclass(frozen=True)
class HelpersConfig:
    """One comparison; frozen plain values, so it is the runner's job key."""

    pair: str
    sampling: SamplingConfig
    helpers: tuple[str, ...] = HELPERS
    presets: tuple[str, ...] = PRESETS
    max_new_tokens: int = MAX_NEW

    def __post_init__(self) -> None:
        if not self.helpers:
            raise ValueError("choose at least one helper to compare")
        for h in self.helpers:
            drafters.spec(h)  # a clear error for an unknown name
        for p in self.presets:
            if get_preset(p) is None:
                raise ValueError(f"unknown preset {p!r}")

    def generation(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=GAMMA, sampling=self.sampling)

    @property
    def runs(self) -> int:
        return len(self.presets) * (1 + len(self.helpers))


def available(pair: Any, helpers: Sequence[str] = HELPERS) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The helpers this pair can run, and a line for each it cannot (no draft model, no trained head)."""
    ok, missing = [], []
    for name in helpers:
        problem = drafting.why_not(name, pair)
        if problem is None:
            ok.append(name)
        else:
            missing.append(problem)
    return tuple(ok), tuple(missing)


@dataclass(frozen=True)
class HelperPoint:
    """One helper on one preset."""

    preset: str
    helper: str
    alpha: float | None  # accepted ÷ checked drafted tokens
    c: float | None  # the helper's cost per drafted token ÷ a target step, both measured in these runs
    tokens_per_call: float | None  # new tokens per target pass
    speedup: float | None  # target alone ms/token ÷ this run's
    identical: bool | None  # greedy: the target's own tokens


@dataclass(frozen=True)
class HelpersResult:
    config: HelpersConfig
    points: tuple[HelperPoint, ...]

    def point(self, preset: str, helper: str) -> HelperPoint | None:
        return next((p for p in self.points if (p.preset, p.helper) == (preset, helper)), None)

    def winner(self, preset: str) -> HelperPoint | None:
        """The helper with the highest measured speed-up on a preset."""
        scored = [p for p in self.points if p.preset == preset and p.speedup is not None]
        return max(scored, key=lambda p: p.speedup) if scored else None  # type: ignore[arg-type, return-value]

    def leaders(self, preset: str) -> tuple[HelperPoint, ...]:
        """The fastest helper on a preset and every one within ranking.MIN_MARGIN of it (one run each, so no spread
        is measured: the floor decides; several leaders are "about the same")."""
        return ranking.leaders([p for p in self.points if p.preset == preset], lambda p: p.speedup, ranking.MIN_MARGIN)


def helpers_steps(pair: Any, config: HelpersConfig) -> Generator[Progress, None, HelpersResult]:
    """The runner job: per preset the target alone, then each helper; a Progress per round and after each run."""
    helpers, missing = available(pair, config.helpers)
    if not helpers:
        raise ValueError("none of these helpers can run on this pair: " + "; ".join(missing))
    budget, eos, cfg = config.max_new_tokens, tuple(pair.eos_ids), config.generation()
    total = budget * len(config.presets) * (1 + len(helpers))
    done, points = 0, []
    for preset in config.presets:
        ids = encode_prompt(pair.tokenizer, get_preset(preset).prompt)
        yield Progress(done, total, f"{preset}: target alone…")
        base = yield from with_progress(autoregressive_generate(pair.target, pair.tokenizer, ids, cfg, eos),
                                        done, total, f"{preset}: target alone", budget)
        done += budget
        for helper in helpers:
            drafter = drafting.resolve(helper, pair)
            gen = yield from with_progress(speculative_generate(pair.target, drafter, pair.tokenizer, ids, cfg, eos),
                                           done, total, f"{preset}: {drafters.spec(helper).title}", budget)
            cmp = metrics.compare(gen, base)
            points.append(HelperPoint(preset, helper, cmp.alpha_checked, cmp.c, cmp.tokens_per_target_call,
                                      cmp.speedup, cmp.identical))
            done += budget
    yield Progress(total, total, "all runs done")
    return HelpersResult(config, tuple(points))
