"""Why checking is cheap, measured: one target pass over k new tokens on a KV cache (batches: bench/batch)."""

from __future__ import annotations

import json
import time
import math
import statistics
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from specviz.bench.timing import Machine, machine_of, model_device, prefilled, spread, timed_pass_ms
from specviz.settings import encode_prompt
from specviz.core.limits import DEFAULT_GAMMA, check_repeats
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
    weights: str = ""  # the target's weight form and kernel as loaded ("gguf on blockgemm (avx512)"): what ran

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


def new_token_ids(ids: Ids, k: int) -> list[int]:
    """k ids to feed (the context's own, cycled): their values do not change the cost."""
    return [ids[i % len(ids)] for i in range(k)]


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
    costs = yield from measure_pass_costs({pair: target}, tokenizer, config)
    return costs[0]


def weights_words(precision: str, kernel: str) -> str:
    """A loaded target's weight form and matrix kernel, in the words the page names them ("gguf on blockgemm")."""
    return f"{precision} on {kernel}" if kernel else precision


def measure_loaded_pass_cost(pair: Any, name: str, config: PassCostConfig = PassCostConfig()
                             ) -> Generator[Progress, None, PassCost]:
    """`measure_pass_cost` of a loaded pair's target, recording the weight form and kernel that ran (the page names
    them beside the figures: a fixed sentence about one precision was wrong whenever another was loaded)."""
    cost = yield from measure_pass_cost(pair.target, pair.tokenizer, name, config)
    return replace(cost, weights=weights_words(pair.target_precision, pair.target_kernel))


def measure_pass_costs(targets: Mapping[str, torch.nn.Module], tokenizer: Any,
                       config: PassCostConfig = PassCostConfig()) -> Generator[Progress, None, tuple[PassCost, ...]]:
    """`measure_pass_cost` for several targets (the same model on two kernels), timed turn about: each repeat passes
    every k through every target, so a slow spell on a shared machine touches all of them alike."""
    device = model_device(next(iter(targets.values())))
    ids = encode(tokenizer, config.prompt)
    yield Progress(0, 1, f"reading the {len(ids)}-token context into the KV cache")
    lms = {name: prefilled(model, ids) for name, model in targets.items()}
    rounds = config.warmup + config.repeats
    total, done = rounds * len(config.ks) * len(lms), 0
    times: dict[tuple[str, int], list[float]] = {(n, k): [] for n in lms for k in config.ks}
    for r in range(rounds):
        # every k once per round (not all repeats of one k in a row): a slow spell on a shared machine
        # then touches every k alike instead of bending the curve
        for k in config.ks:
            for name, lm in lms.items():
                ms = timed_pass_ms(lm, new_token_ids(ids, k))
                if r >= config.warmup:
                    times[(name, k)].append(ms)
                done += 1
                what = "warming up" if r < config.warmup else f"repeat {r - config.warmup + 1}/{config.repeats}"
                yield Progress(done, total, f"{what}: a pass over {k} new token{'s' * (k > 1)} took {ms:.0f} ms"
                               + (f" ({name})" if len(lms) > 1 else ""))
    return tuple(PassCost(name, machine_of(device), len(ids), config.ks, tuple(tuple(times[(name, k)]) for k in config.ks))
                 for name in lms)


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
        **({"weights": p.weights} if p.weights else {}),
    }


def pass_cost_from_dict(d: Mapping[str, Any]) -> PassCost:
    return PassCost(str(d["pair"]), Machine(**d["machine"]), int(d["context_tokens"]), tuple(int(k) for k in d["ks"]),
                    tuple(tuple(float(t) for t in ts) for ts in d["times_ms"]), str(d.get("weights", "")))


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


# ------------------------------------------------------------------------------------------
# Two kernels side by side: one decoder layer's linears, its real weights, 1..16 rows
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCost:
    """One decoder layer's seven linears (its real weights) timed through each fp16-weight kernel, per row count."""

    kernels: tuple[str, ...]  # e.g. ("rowgemm avx512", "fbgemm")
    ks: tuple[int, ...]
    times_ms: tuple[tuple[tuple[float, ...], ...], ...]  # [kernel][k] -> repeats (the layer's seven matmuls in a row)
    layers: int  # decoder layers in the model: a pass runs the layer's linears this many times
    layer_mb: float  # the layer's fp16 weights, read once per pass through it

    def median_ms(self, kernel: int) -> tuple[float, ...]:
        return tuple(statistics.median(t) for t in self.times_ms[kernel])

    def ratios(self, kernel: int) -> tuple[float, ...]:
        """Each k's median over one row's: the layer's linears' cost in one-row steps."""
        med = self.median_ms(kernel)
        return tuple(m / med[self.ks.index(1)] for m in med)


def kernel_twins(target: torch.nn.Module, layer: int = 0) -> dict[str, list[Any]]:
    """The layer's linears through every fp16-weight kernel this machine has: {kernel name: [layer per matrix]}.
    Copies of one layer's weights (about 90 MB for the Qwen 1.5B), made one matrix at a time; {} where the target's
    linears are not fp16-weight ones (fp32, bf16, a GPU)."""
    from specviz.models import half, rowgemm

    block = target.model.layers[layer] if hasattr(target, "model") and hasattr(target.model, "layers") else None
    mats = [m for m in block.modules() if isinstance(m, half.HalfLinear)] if block is not None else []
    if not mats:
        return {}
    kinds: dict[str, Any] = {}
    if rowgemm.kernel() is not None:
        kinds[f"rowgemm {rowgemm.kernel().isa}"] = rowgemm.kernel()
    if half.fbgemm_works():
        kinds["fbgemm"] = None
    with torch.no_grad():
        return {name: [half.HalfLinear(m.unpacked_weight().half(), m.bias, kernel=k) for m in mats]
                for name, k in kinds.items()}


@dataclass(frozen=True)
class KernelConfig:
    """What the kernel comparison times."""

    ks: tuple[int, ...] = PASS_KS  # rows scored at once
    repeats: int = 5  # timed rounds (each: every k through every kernel); the median is reported

    def __post_init__(self) -> None:
        check_repeats(self.repeats, 1)


def fbgemm_twin(target: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of an fp16w target whose linears run on fbgemm (the kernel before rowgemm), sharing every other tensor,
    for timing whole passes of both in one run (the CLI's --compare-kernels: 3.1 GB more for the Qwen 1.5B). None
    where the target's linears are not rowgemm ones or fbgemm does not run here."""
    import copy

    from specviz.models import half
    from specviz.models.packed import layers_of

    layers = [m for m in target.modules() if isinstance(m, half.HalfLinear) and m.panels is not None]
    if not layers or not half.fbgemm_works():
        return None
    shared = {id(t): t for t in [*target.parameters(), *target.buffers()]}
    shared.update({id(m): m for m in layers})  # not copied: replaced below
    twin = copy.deepcopy(target, memo=shared)
    with torch.no_grad():
        for parent, name, child in layers_of(twin, half.HalfLinear):
            setattr(parent, name, half.HalfLinear(rowgemm_weight(child), child.bias, kernel=None))
    return twin


def rowgemm_weight(layer: Any) -> torch.Tensor:
    """A rowgemm layer's fp16 weight (N, K) back from its panels."""
    from specviz.models import rowgemm

    return rowgemm.unpack(layer.panels, layer.out_features)


def measure_kernel_cost(target: torch.nn.Module,
                        config: KernelConfig = KernelConfig()) -> Generator[Progress, None, KernelCost]:
    """Time one decoder layer's linears through each kernel at each row count, turn about (every kernel this machine
    has: one, or none where the target's linears are not fp16-weight ones)."""
    ks, repeats = config.ks, config.repeats
    yield Progress(0, 1, "copying one layer's weights into each kernel's form")
    twins = kernel_twins(target)
    if not twins:
        return KernelCost((), ks, (), int(target.config.num_hidden_layers), 0.0)
    gen = torch.Generator().manual_seed(0)
    width = max(m.in_features for layers in twins.values() for m in layers)
    rows = torch.randn(max(ks), width, generator=gen)
    times: dict[tuple[str, int], list[float]] = {(n, k): [] for n in twins for k in ks}
    total, done = (repeats + 1) * len(ks) * len(twins), 0
    with torch.no_grad():
        for r in range(repeats + 1):  # the first round warms up
            for k in ks:
                for name, layers in twins.items():
                    t0 = time.perf_counter()
                    for m in layers:
                        m(rows[:k, : m.in_features])
                    ms = (time.perf_counter() - t0) * 1000.0
                    if r:
                        times[(name, k)].append(ms)
                    done += 1
                    yield Progress(done, total, f"{name}: one layer's linears over {k} row{'s' * (k > 1)} took {ms:.2f} ms")
    names = tuple(twins)
    layer_mb = sum(m.nbytes() for m in next(iter(twins.values()))) / 1e6
    return KernelCost(names, ks, tuple(tuple(tuple(times[(n, k)]) for k in ks) for n in names),
                      int(target.config.num_hidden_layers), layer_mb)


# ------------------------------------------------------------------------------------------
# Where a round's time goes (D5): one profiled run, lap timers on
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileConfig:
    """What the round profile runs: a model-drafter chain on a prompt, greedy."""

    prompt: str = CONTEXT
    gamma: int = DEFAULT_GAMMA
    max_new_tokens: int = 24


def measure_round_profile(pair: Any, config: ProfileConfig = ProfileConfig()) -> Generator[Progress, None, Any]:
    """One greedy model-drafter run with lap timers on (core.profile): where each ms of its rounds went."""
    from specviz.core import profile
    from specviz.core.drafters.model import ModelDrafter
    from specviz.core.engine import speculative_generate
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig

    ids = encode(pair.tokenizer, config.prompt)
    cfg = GenerationConfig(max_new_tokens=config.max_new_tokens, gamma=config.gamma, sampling=SamplingConfig("greedy"))
    yield Progress(0, config.max_new_tokens, "one run with lap timers on")
    with profile.recording(pair.target) as laps:
        steps = speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, ids, cfg, pair.eos_ids)
        made = 0
        while True:
            try:
                r = next(steps)
            except StopIteration as end:
                gen = end.value
                break
            made += len(r.new_ids)
            yield Progress(min(made, config.max_new_tokens), config.max_new_tokens, f"round {r.index + 1}: {made} tokens")
    return profile.summarise(laps, len(gen.rounds), gen.decode_ms)
