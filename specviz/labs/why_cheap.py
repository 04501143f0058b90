"""Why checking is cheap, measured: one target pass over k new tokens on a KV cache (batches: bench/batch)."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specviz.bench.timing import Machine, machine_of, model_device, prefilled_cache, spread, timed_pass_ms
from specviz.settings import encode_prompt
from specviz.core.limits import check_repeats
from specviz.core.progress import Progress

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
# Where GPU figures measured with this same code go (`python -m specviz why-cheap --device cuda --json`).
GPU_FIGURES = Path(__file__).resolve().parents[2] / "assets" / "verify_cost_gpu.json"

Ids = Sequence[int]


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
# The measurement (generators: they yield Progress and return their result)
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


def pass_cost_from_dict(d: Mapping[str, Any]) -> PassCost:
    return PassCost(str(d["pair"]), Machine(**d["machine"]), int(d["context_tokens"]), tuple(int(k) for k in d["ks"]),
                    tuple(tuple(float(t) for t in ts) for ts in d["times_ms"]))


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
    note: str  # where and how they were measured
    step_cost: StepCost | None = None  # target and draft step times (valid even with random weights)


def load_reference(path: Path = GPU_FIGURES) -> Reference | None:
    """The GPU figures file if one was saved (the CLI's --json output); None when there is none yet."""
    if not path.is_file():
        return None
    d = json.loads(path.read_text(encoding="utf-8"))
    # a "batch_effect" key (the timed-pass estimate before bench/batch measured real batches) is not read
    pc, sc = d.get("pass_cost"), d.get("step_cost")
    return Reference(pass_cost_from_dict(pc) if pc else None, str(d.get("note", "")),
                     step_cost_from_dict(sc) if sc else None)
