"""Two precisions, one lesson: the same file's target with its 4-bit blocks and with 16-bit weights, each pass over
1..16 new tokens timed turn about on this machine; where each crosses 1.5 steps, and the best γ and speed-up that
follow with the draft's measured cost."""

from __future__ import annotations

import copy
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specviz.bench.timing import available_bytes
from specviz.core import metrics
from specviz.core.progress import Progress
from specviz.labs.why_cheap import PassCost, PassCostConfig, measure_pass_costs, weights_words

CROSS = 1.5  # steps: where checking stops being "about one step"
GAMMAS = tuple(range(1, 16))  # a chain of γ guesses is checked by a pass over γ + 1 rows: up to 16, the curve's end
MARGIN_BYTES = 0.5e9  # free memory left beside the 16-bit copy (the allocator, the page, other pupils' runs)


class PrecisionError(ValueError):
    """The 16-bit copy cannot be made here (another precision loaded, or too little free memory): one line."""


@dataclass(frozen=True)
class PrecisionCurve:
    """One precision's pass costs and the draft's step beside it."""

    precision: str  # "gguf" / "fp16w"
    weights: str  # what ran, in words ("gguf on blockgemm avx512-vnni, Q4_K blocks")
    cost: PassCost
    draft_step_ms: float  # the draft's one-token pass, the same for both precisions

    @property
    def c(self) -> float:
        """The draft's step over this target's step."""
        return self.draft_step_ms / self.cost.step_ms

    def steps_at(self, rows: float) -> float:
        """The pass over `rows` new tokens in one-token steps, read off the measured curve (linear between points)."""
        return float(np.interp(rows, self.cost.ks, self.cost.ratios))  # flat beyond the measured ends

    def crossing(self, level: float = CROSS) -> float | None:
        """The number of new tokens at which a pass first costs `level` steps (linear between measured points); None
        when no measured pass costs that much."""
        points = list(zip(self.cost.ks, self.cost.ratios))
        for (k0, r0), (k1, r1) in zip(points, points[1:]):
            if r1 >= level > r0:
                return k0 + (level - r0) * (k1 - k0) / (r1 - r0)
        return None

    def speedup(self, alpha: float, gamma: int) -> float:
        """Leviathan's speed-up with this machine's cost of a (γ+1)-token pass and this precision's c."""
        return metrics.expected_speedup_at_cost(alpha, gamma, self.c, self.steps_at(gamma + 1))

    def best(self, alpha: float, gammas: Sequence[int] = GAMMAS) -> tuple[int, float]:
        """(γ, speed-up) with the highest expected speed-up."""
        gamma = max(gammas, key=lambda g: self.speedup(alpha, g))
        return gamma, self.speedup(alpha, gamma)


@dataclass(frozen=True)
class TwoPrecisions:
    """The 4-bit curve first, the 16-bit one second."""

    four: PrecisionCurve
    sixteen: PrecisionCurve
    copy_seconds: float  # making the 16-bit copy of the target's matrices


def block_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, Any]]:
    """(parent, name, layer) of every GGUF-block linear of a model."""
    from specviz.models.blocks import BlockLinear
    from specviz.models.packed import layers_of

    return list(layers_of(model, BlockLinear))


def sixteen_bit_bytes(model: torch.nn.Module) -> int:
    """What the 16-bit copy of a model's block linears holds."""
    return sum(2 * m.in_features * m.out_features for _, _, m in block_layers(model))


def check_room(model: torch.nn.Module) -> None:
    """Refuse (PrecisionError) where the target holds no GGUF blocks or the copy would not fit in free memory."""
    need = sixteen_bit_bytes(model)
    if need == 0:
        raise PrecisionError("the target holds no GGUF blocks here (the sidebar names its precision): "
                             "the 4-bit and 16-bit comparison needs the gguf precision")
    free = available_bytes(torch.device("cpu"))
    if free < need + MARGIN_BYTES:
        raise PrecisionError(f"the 16-bit copy needs {need / 1e9:.1f} GB and this server has {free / 1e9:.1f} GB free")


def sixteen_bit_twin(target: torch.nn.Module) -> torch.nn.Module:
    """A copy of a gguf target whose block linears hold fp16 weights (each value as the blocks give it, rounded to
    fp16 as the fp16w precision stores it), on the fp16 kernel the fp16w precision uses; every other tensor shared."""
    from specviz.models import half, rowgemm

    layers = block_layers(target)
    shared = {id(t): t for t in [*target.parameters(), *target.buffers()]}
    shared.update({id(m): m for _, _, m in layers})  # not copied: replaced below
    for module in target.modules():  # the embedding's blocks and any other tensor held outside parameters
        shared.update({id(v): v for v in vars(module).values() if isinstance(v, torch.Tensor)})
    twin = copy.deepcopy(target, memo=shared)
    with torch.no_grad():
        for parent, name, layer in block_layers(twin):
            weight = layer.rows(torch.arange(layer.out_features)).half()
            setattr(parent, name, half.HalfLinear(weight, layer.bias, kernel="chosen"))
    rowgemm.fuse(twin)  # q/k/v and gate/up side by side, as an fp16w target loads
    from specviz.core import lean

    if hasattr(twin, lean.GLUE):  # an fp16w target runs its norms, rotary and gate as torch ops, not the gguf glue
        delattr(twin, lean.GLUE)
    return twin


def measure_two_precisions(pair: Any, config: PassCostConfig = PassCostConfig()
                           ) -> Generator[Progress, None, TwoPrecisions]:
    """Make the 16-bit copy, time both targets' passes turn about and the draft's step, then let the copy go."""
    import time

    check_room(pair.target)
    yield Progress(0, 1, f"making a 16-bit copy of the target's matrices ({sixteen_bit_bytes(pair.target) / 1e9:.1f} GB)")
    t0 = time.perf_counter()
    twin = sixteen_bit_twin(pair.target)
    copied = time.perf_counter() - t0
    try:
        costs = yield from measure_pass_costs({"gguf": pair.target, "fp16w": twin}, pair.tokenizer, config)
    finally:
        del twin
    draft_cfg = PassCostConfig(ks=(1,), repeats=config.repeats, warmup=config.warmup, prompt=config.prompt)
    (draft,) = yield from measure_pass_costs({"draft": pair.draft}, pair.tokenizer, draft_cfg)
    step = draft.step_ms
    four = PrecisionCurve("gguf", weights_words("gguf", pair.target_kernel), costs[0], step)
    sixteen = PrecisionCurve("fp16w", weights_words("fp16w", _fp16_kernel_name()), costs[1], step)
    return TwoPrecisions(four, sixteen, copied)


def _fp16_kernel_name() -> str:
    from specviz.models import rowgemm

    kern = rowgemm.kernel()
    return f"rowgemm {kern.isa}" if kern is not None else "fbgemm"


def to_dict(two: TwoPrecisions) -> dict[str, Any]:
    """The measurement as JSON-ready data (the page's download; a test's recording)."""
    from specviz.labs.why_cheap import pass_cost_to_dict

    return {"copy_seconds": round(two.copy_seconds, 2),
            **{key: {"precision": c.precision, "weights": c.weights, "draft_step_ms": round(c.draft_step_ms, 3),
                     "pass_cost": pass_cost_to_dict(c.cost)} for key, c in (("four", two.four), ("sixteen", two.sixteen))}}


def from_dict(d: dict[str, Any]) -> TwoPrecisions:
    """to_dict's data back (a recording)."""
    from specviz.labs.why_cheap import pass_cost_from_dict

    def curve(c: dict[str, Any]) -> PrecisionCurve:
        return PrecisionCurve(c["precision"], c["weights"], pass_cost_from_dict(c["pass_cost"]), c["draft_step_ms"])

    return TwoPrecisions(curve(d["four"]), curve(d["sixteen"]), d["copy_seconds"])
