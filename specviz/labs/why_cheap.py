"""Why checking is cheap, measured: one target pass over k new tokens on a KV cache, and the batch effect."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specviz.bench.timing import (
    Machine, available_bytes, batch_bytes, machine_of, memory_problem, model_device, prefilled_cache, spread, timed_pass_ms,
)
from specviz.settings import Settings, encode_prompt
from specviz.core.drafters.model import ModelDrafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.limits import check_gamma, check_repeats
from specviz.core.trace import GenerationConfig
from specviz.core.progress import Progress, drain, with_progress
from specviz.core.metrics import compare, expected_speedup_at_cost
from specviz.core.sampling import SamplingConfig

# A fixed context, prefilled once into the KV cache before any timed pass (about 90 tokens of code):
# the passes then look like decoding steps in the middle of a real generation, not like a prefill.
CONTEXT = (
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
    '    """Merge two sorted lists into one sorted list."""\n'
    "    out: list[int] = []\n"
    "    i = j = 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n"
    "            out.append(a[i])\n"
    "            i += 1\n"
    "        else:\n"
    "            out.append(b[j])\n"
    "            j += 1\n"
)
PASS_KS: tuple[int, ...] = (1, 2, 4, 8, 16)
BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8)
# Where GPU figures measured with this same code go (`python -m specviz why-cheap --device cuda --json`).
GPU_FIGURES = Path(__file__).resolve().parents[2] / "assets" / "verify_cost_gpu.json"

Ids = Sequence[int]
Available = Callable[[torch.device], int]


# ------------------------------------------------------------------------------------------
# Configs and results (frozen: they double as the runner's cache keys)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassCostConfig:
    """What the pass-cost measurement times."""

    ks: tuple[int, ...] = PASS_KS  # new tokens per timed pass; must include 1 (the step everything is compared to)
    repeats: int = 5  # timed passes per k; the median is reported (robust to one hiccup)
    warmup: int = 1  # untimed rounds first (allocator, lazy initialisation, CPU caches)
    prompt: str = CONTEXT  # fixed context prefilled once into the KV cache

    def __post_init__(self) -> None:
        check_repeats(self.repeats, self.warmup)
        if 1 not in self.ks or any(k < 1 for k in self.ks) or list(self.ks) != sorted(set(self.ks)):
            raise ValueError(f"ks must be increasing positive counts that include 1, got {self.ks}")


@dataclass(frozen=True)
class BatchConfig:
    """What the batch-effect measurement times, and the short real run that measures α and c."""

    gamma: int = 4  # draft length γ: the verify pass scores γ + 1 tokens per sequence
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # decoding of the short real run (sets α)
    batch_sizes: tuple[int, ...] = BATCH_SIZES  # sequences per pass, each a copy of the context
    repeats: int = 3  # timed passes per batch size and kind (median reported)
    warmup: int = 1  # untimed rounds first, per batch size
    run_tokens: int = 24  # new tokens of the short speculative run (and its plain twin) that measure α and c
    prompt: str = CONTEXT

    def __post_init__(self) -> None:
        check_repeats(self.repeats, self.warmup)
        check_gamma(self.gamma)
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes) or list(self.batch_sizes) != sorted(
                set(self.batch_sizes)):
            raise ValueError(f"batch sizes must be increasing positive counts, got {self.batch_sizes}")
        if self.run_tokens < 1:
            raise ValueError(f"run_tokens must be >= 1, got {self.run_tokens}")


def batch_config(s: Settings, repeats: int) -> BatchConfig:
    """The batch-effect measurement a page asks for: the sidebar's γ and decoding set α, so they are part of it."""
    return BatchConfig(gamma=s.gamma, sampling=s.sampling, repeats=repeats)


@dataclass(frozen=True)
class PassCost:
    """Measured time of one target forward pass over k new tokens on a prefilled KV cache."""

    pair: str
    machine: Machine
    context_tokens: int  # tokens in the KV cache before each timed pass
    ks: tuple[int, ...]
    times_ms: tuple[tuple[float, ...], ...]  # every timed pass, per k (same order as ks)

    @property
    def median_ms(self) -> tuple[float, ...]:
        return tuple(statistics.median(t) for t in self.times_ms)

    @property
    def step_ms(self) -> float:
        """The one-token pass: one plain decoding step."""
        return self.median_ms[self.ks.index(1)]

    @property
    def ratios(self) -> tuple[float, ...]:
        """Median time of each k divided by that of k = 1: the pass's cost in decoding steps."""
        return tuple(m / self.step_ms for m in self.median_ms)

    @property
    def spread(self) -> float:
        return spread(self.times_ms)

    @property
    def linear_ms(self) -> tuple[float, ...]:
        """What each pass would cost if the cost grew with the tokens (k one-token steps)."""
        return tuple(k * self.step_ms for k in self.ks)


@dataclass(frozen=True)
class BatchPoint:
    """Timed passes at one batch size: the one-token step, the (γ+1)-token verify, the draft's step."""

    batch: int
    step_ms: tuple[float, ...]  # target, 1 new token per sequence
    verify_ms: tuple[float, ...]  # target, γ + 1 new tokens per sequence
    draft_ms: tuple[float, ...]  # draft, 1 new token per sequence

    @property
    def step_median_ms(self) -> float:
        return statistics.median(self.step_ms)

    @property
    def verify_median_ms(self) -> float:
        return statistics.median(self.verify_ms)

    @property
    def draft_median_ms(self) -> float:
        return statistics.median(self.draft_ms)

    @property
    def verify_ratio(self) -> float:
        """The verify pass in target steps at this batch size (Leviathan's model assumes 1)."""
        return self.verify_median_ms / self.step_median_ms

    @property
    def draft_ratio(self) -> float:
        """Draft step ÷ target step at this batch size, from timed passes."""
        return self.draft_median_ms / self.step_median_ms


@dataclass(frozen=True)
class BatchEffect:
    """α and c from a short real run, and timed passes per batch size: the speed-up each batch size allows."""

    pair: str
    machine: Machine
    gamma: int
    context_tokens: int
    alpha: float | None  # Leviathan's α (accepted ÷ checked) of the short real speculative run (batch 1)
    c: float | None  # measured c of that run: median draft ms per token ÷ target ms per step
    run_speedup: float | None  # that run's measured walltime speed-up over its plain twin (batch 1, real)
    run_tokens_per_call: float | None
    points: tuple[BatchPoint, ...]
    stopped: str | None  # why larger batch sizes were not measured (memory), or None

    def c_at(self, point: BatchPoint) -> float | None:
        """c at a batch size: the run's c, scaled by how batching changed the draft's step against the target's.

        Anchored to the real run (its c includes the drafter's sampling overhead), while the timed passes
        say how the two models' costs move as the batch grows.
        """
        if self.c is None or not self.points:
            return None
        return self.c * point.draft_ratio / self.points[0].draft_ratio

    def speedup_at(self, point: BatchPoint) -> float | None:
        """Leviathan's expected speed-up with the measured verify cost of this batch size instead of 1."""
        c = self.c_at(point)
        if self.alpha is None or c is None:
            return None
        return expected_speedup_at_cost(self.alpha, self.gamma, c, point.verify_ratio)

    @property
    def speedups(self) -> tuple[float | None, ...]:
        return tuple(self.speedup_at(p) for p in self.points)

    def speedup_range(self, point: BatchPoint) -> tuple[float, float] | None:
        """Lowest and highest expected speed-up over the repeats (repeat i's step, verify and draft times together)."""
        if self.alpha is None or self.c is None or not self.points:
            return None
        base = self.points[0].draft_ratio
        each = [expected_speedup_at_cost(self.alpha, self.gamma, self.c * (d / s) / base, v / s)
                for s, v, d in zip(point.step_ms, point.verify_ms, point.draft_ms)]
        return (min(each), max(each)) if each else None

    def pattern(self) -> str:
        """How the speed-up moves with the batch, judged against the repeats' spread.

        "declines": the largest batch's whole range lies below batch 1's (the textbook pattern);
        "rises": it lies above; "flat": the ranges overlap, so the repeats cannot tell them apart;
        "unknown": fewer than two batch sizes, or nothing to compute.
        """
        ranges = [self.speedup_range(p) for p in self.points]
        if len(ranges) < 2 or ranges[0] is None or ranges[-1] is None:
            return "unknown"
        (lo1, hi1), (lo_n, hi_n) = ranges[0], ranges[-1]
        if hi_n < lo1:
            return "declines"
        if lo_n > hi1:
            return "rises"
        return "flat"

    @property
    def spread(self) -> float:
        return spread([t for p in self.points for t in (p.step_ms, p.verify_ms, p.draft_ms)])


def new_token_ids(ids: Ids, k: int, batch: int, device: torch.device) -> torch.Tensor:
    """k ids to feed per sequence (the context's own, cycled): their values do not change the cost."""
    row = [ids[i % len(ids)] for i in range(k)]
    return torch.tensor([row] * batch, dtype=torch.long, device=device)  # (batch, k)


def encode(tokenizer: Any, prompt: str) -> list[int]:
    """The measurement context's ids (settings.encode_prompt), at least two of them."""
    ids = encode_prompt(tokenizer, prompt)
    if len(ids) < 2:
        raise ValueError("the measurement context encodes to fewer than 2 tokens")
    return ids


# ------------------------------------------------------------------------------------------
# The two measurements (generators: they yield Progress and return their result)
# ------------------------------------------------------------------------------------------


def measure_pass_cost(target: torch.nn.Module, tokenizer: Any, pair: str,
                      config: PassCostConfig = PassCostConfig()) -> Generator[Progress, None, PassCost]:
    """Time one target pass over each k new tokens on a prefilled cache (median of repeats)."""
    device = model_device(target)
    ids = encode(tokenizer, config.prompt)
    yield Progress(0, 1, f"reading the {len(ids)}-token context into the KV cache")
    cache = prefilled_cache(target, ids)
    rounds = config.warmup + config.repeats
    total, done = rounds * len(config.ks), 0
    times: dict[int, list[float]] = {k: [] for k in config.ks}
    feeds = {k: new_token_ids(ids, k, 1, device) for k in config.ks}
    for r in range(rounds):
        # every k once per round (not all repeats of one k in a row): a slow spell on a shared machine
        # then touches every k alike instead of bending the curve
        for k in config.ks:
            ms = timed_pass_ms(target, cache, feeds[k])
            if r >= config.warmup:
                times[k].append(ms)
            done += 1
            what = "warming up" if r < config.warmup else f"repeat {r - config.warmup + 1}/{config.repeats}"
            yield Progress(done, total, f"{what}: a pass over {k} new token{'s' * (k > 1)} took {ms:.0f} ms")
    return PassCost(pair, machine_of(device), len(ids), config.ks, tuple(tuple(times[k]) for k in config.ks))


def measure_batch_effect(target: torch.nn.Module, draft: torch.nn.Module, tokenizer: Any, eos_ids: Sequence[int],
                         pair: str, config: BatchConfig = BatchConfig(),
                         available: Available = available_bytes) -> Generator[Progress, None, BatchEffect]:
    """α and c from a short real run at batch 1; then timed target steps, verify passes and draft steps per batch."""
    device = model_device(target)
    ids = encode(tokenizer, config.prompt)
    n_run = config.run_tokens
    rounds = config.warmup + config.repeats
    total = 2 * n_run + len(config.batch_sizes) * rounds * 3
    gen = GenerationConfig(max_new_tokens=n_run, gamma=config.gamma, sampling=config.sampling, stop_at_eos=False)
    yield Progress(0, total, "warming up both models (a two-token run, not timed)")
    warm = GenerationConfig(max_new_tokens=2, gamma=config.gamma, sampling=config.sampling, stop_at_eos=False)
    drain(speculative_generate(target, ModelDrafter(draft), tokenizer, ids, warm, eos_ids))
    spec = yield from with_progress(speculative_generate(target, ModelDrafter(draft), tokenizer, ids, gen, eos_ids),
                             0, total, "short speculative run (measures α)", n_run)
    plain = yield from with_progress(autoregressive_generate(target, tokenizer, ids, gen, eos_ids),
                              n_run, total, "the same run without a helper (measures c)", n_run)
    done = 2 * n_run
    points: list[BatchPoint] = []
    stopped: str | None = None
    verify_k = config.gamma + 1
    for b in config.batch_sizes:
        need = batch_bytes(target.config, b, verify_k, len(ids)) + batch_bytes(draft.config, b, 1, len(ids))
        stopped = memory_problem(need, available(device), b)
        if stopped:
            break
        point = yield from _time_batch(target, draft, ids, b, verify_k, config, done, total)
        points.append(point)
        done += rounds * 3
    cmp = compare(spec, plain)  # Leviathan's α (checked positions), not the drafted acceptance
    return BatchEffect(
        pair, machine_of(device), config.gamma, len(ids), cmp.alpha_checked, cmp.c,
        cmp.speedup, cmp.tokens_per_target_call, tuple(points), stopped,
    )


def _time_batch(target: torch.nn.Module, draft: torch.nn.Module, ids: Ids, b: int, verify_k: int,
                config: BatchConfig, done: int, total: int) -> Generator[Progress, None, BatchPoint]:
    device = model_device(target)
    yield Progress(done, total, f"batch {b}: copying the context into {b} KV caches")
    tcache, dcache = prefilled_cache(target, ids, b), prefilled_cache(draft, ids, b)
    step_feed, verify_feed = new_token_ids(ids, 1, b, device), new_token_ids(ids, verify_k, b, device)
    draft_feed = new_token_ids(ids, 1, b, model_device(draft))
    times: dict[str, list[float]] = {"step": [], "verify": [], "draft": []}
    for r in range(config.warmup + config.repeats):
        for kind, model, cache, feed in (("step", target, tcache, step_feed), ("verify", target, tcache, verify_feed),
                                         ("draft", draft, dcache, draft_feed)):
            ms = timed_pass_ms(model, cache, feed)
            if r >= config.warmup:
                times[kind].append(ms)
            done += 1
            yield Progress(done, total, f"batch {b}: {kind} pass {ms:.0f} ms")
    del tcache, dcache  # free this batch's caches before the next, larger one is checked and allocated
    return BatchPoint(b, tuple(times["step"]), tuple(times["verify"]), tuple(times["draft"]))


# ------------------------------------------------------------------------------------------
# JSON: the CLI prints it; a file of it (measured on a GPU) is shown next to this machine's figures
# ------------------------------------------------------------------------------------------


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def pass_cost_to_dict(p: PassCost) -> dict[str, Any]:
    return {
        "pair": p.pair, "machine": vars(p.machine), "context_tokens": p.context_tokens, "ks": list(p.ks),
        "times_ms": [[_r(t) for t in ts] for ts in p.times_ms],
        "median_ms": [_r(m) for m in p.median_ms], "ratio_to_one_token": [_r(x) for x in p.ratios],
    }


def batch_effect_to_dict(e: BatchEffect) -> dict[str, Any]:
    return {
        "pair": e.pair, "machine": vars(e.machine), "gamma": e.gamma, "context_tokens": e.context_tokens,
        "alpha": _r(e.alpha), "c": _r(e.c), "run_speedup": _r(e.run_speedup),
        "run_tokens_per_call": _r(e.run_tokens_per_call), "stopped": e.stopped,
        "points": [{
            "batch": p.batch, "step_ms": [_r(t) for t in p.step_ms], "verify_ms": [_r(t) for t in p.verify_ms],
            "draft_ms": [_r(t) for t in p.draft_ms], "verify_ratio": _r(p.verify_ratio),
            "step_median_ms": _r(p.step_median_ms), "verify_median_ms": _r(p.verify_median_ms),
            "c": _r(e.c_at(p)), "expected_speedup": _r(e.speedup_at(p)),
        } for p in e.points],
    }


def pass_cost_from_dict(d: Mapping[str, Any]) -> PassCost:
    return PassCost(str(d["pair"]), Machine(**d["machine"]), int(d["context_tokens"]), tuple(int(k) for k in d["ks"]),
                    tuple(tuple(float(t) for t in ts) for ts in d["times_ms"]))


def batch_effect_from_dict(d: Mapping[str, Any]) -> BatchEffect:
    def opt(x: Any) -> float | None:
        return None if x is None else float(x)

    points = tuple(BatchPoint(int(p["batch"]), tuple(map(float, p["step_ms"])), tuple(map(float, p["verify_ms"])),
                              tuple(map(float, p["draft_ms"]))) for p in d["points"])
    return BatchEffect(str(d["pair"]), Machine(**d["machine"]), int(d["gamma"]), int(d["context_tokens"]),
                       opt(d["alpha"]), opt(d["c"]), opt(d["run_speedup"]), opt(d["run_tokens_per_call"]), points,
                       d.get("stopped"))


@dataclass(frozen=True)
class StepCost:
    """One-token step times of the target and the draft measured elsewhere, per batch size (c is their ratio)."""

    pair: str  # what was timed (for random-weight shapes, say so)
    batches: tuple[int, ...]
    target_step_ms: tuple[tuple[float, ...], ...]  # repeats per batch size
    draft_step_ms: tuple[tuple[float, ...], ...]
    generate_ms_per_token: tuple[tuple[str, float], ...] = ()  # transformers `generate`, per setup

    def c_at(self, batch: int) -> float:
        """Median draft step ÷ median target step at one batch size."""
        i = self.batches.index(batch)
        return statistics.median(self.draft_step_ms[i]) / statistics.median(self.target_step_ms[i])


def step_cost_from_dict(d: Mapping[str, Any]) -> StepCost:
    return StepCost(str(d["pair"]), tuple(int(b) for b in d["batches"]),
                    tuple(tuple(map(float, ts)) for ts in d["target_step_ms"]),
                    tuple(tuple(map(float, ts)) for ts in d["draft_step_ms"]),
                    tuple((str(k), float(v)) for k, v in d.get("generate_ms_per_token", {}).items()))


@dataclass(frozen=True)
class Reference:
    """Figures measured elsewhere with this code (a GPU), to show next to this machine's."""

    pass_cost: PassCost | None
    batch_effect: BatchEffect | None
    note: str  # where and how they were measured
    step_cost: StepCost | None = None  # target and draft step times (valid even with random weights)


def load_reference(path: Path = GPU_FIGURES) -> Reference | None:
    """The GPU figures file if one was saved (the CLI's --json output); None when there is none yet."""
    if not path.is_file():
        return None
    d = json.loads(path.read_text(encoding="utf-8"))
    pc, be, sc = d.get("pass_cost"), d.get("batch_effect"), d.get("step_cost")
    return Reference(pass_cost_from_dict(pc) if pc else None, batch_effect_from_dict(be) if be else None,
                     str(d.get("note", "")), step_cost_from_dict(sc) if sc else None)
