"""Why our text never drifts (D5): one row computed alone beside the same row inside 5 and 16 rows, through each
matrix kernel this machine has, on one real weight matrix of the target; and, where llama.cpp is built, its own case."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specviz.bench.agreement import first_difference
from specviz.core.progress import Progress

ROW_COUNTS = (5, 16)  # a γ = 4 check and a 16-token check
POSITION = 2  # the row we follow: third in each batch (not first: a kernel's first row can be special)
SEED = 0


@dataclass(frozen=True)
class RowCheck:
    """One kernel, one batch size: is the followed row's output the same bits as when it was computed alone?"""

    kernel: str  # in words: which kernel and which weights
    ours: bool  # a kernel of specviz (the engine's), else torch's
    rows: int
    equal: bool  # torch.equal: every bit
    max_abs_diff: float  # largest |alone - inside| over the row's outputs (0.0 when equal)


@dataclass(frozen=True)
class RowBits:
    """Every kernel's checks on one matrix of the target."""

    matrix: str  # "layer 0 mlp.gate_proj (1536 → 8960)"
    checks: tuple[RowCheck, ...]

    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.kernel for c in self.checks))


def _matrix(target: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    """The first decoder layer's gate projection: a real weight matrix every token goes through."""
    layer = target.model.layers[0].mlp.gate_proj
    return f"layer 0 mlp.gate_proj ({layer.in_features} → {layer.out_features})", layer


def _weight(layer: torch.nn.Module) -> torch.Tensor:
    """The matrix's weight as fp32 (N, K), whatever form it is held in (GGUF blocks, fp16, fp32)."""
    from specviz.models import blocks

    if isinstance(layer, blocks.BlockLinear):
        return layer.rows(torch.arange(layer.out_features)).float()
    if hasattr(layer, "unpacked_weight"):  # fp16 panels, or fp32 packed for oneDNN
        return layer.unpacked_weight().float()
    return layer.weight.detach().float()


def kernels_for(layer: torch.nn.Module) -> list[tuple[str, bool, Callable[[torch.Tensor], torch.Tensor]]]:
    """(name, ours, matmul) for the loaded layer itself and each other kernel here, on the same weight values."""
    from specviz.models import blocks, half, rowgemm

    w32 = _weight(layer)
    found: list[tuple[str, bool, Callable[[torch.Tensor], torch.Tensor]]] = []
    if isinstance(layer, blocks.BlockLinear):
        found.append((f"blockgemm {layer.kernel.isa} (the file's 4-bit blocks)", True, layer))
    elif type(layer).__name__ == "PackedLinear":  # an fp32 target's own layer: torch's oneDNN on weights packed once
        found.append(("oneDNN on fp32 weights packed once (the loaded target's)", False, layer))
    w16 = w32.half()
    kern = rowgemm.kernel()
    if kern is not None:
        found.append((f"rowgemm {kern.isa} (fp16 weights)", True, half.HalfLinear(w16, None, kernel=kern)))
    if half.agreeing_rows():  # fbgemm runs here: called as torch calls it, no rows padded (HalfLinear pads them)
        packed = half._prepack(w16.float())
        found.append(("torch's fbgemm (fp16 weights)", False, lambda x: half._run(x, packed)))
    found.append(("torch's fp32 matmul (oneDNN / MKL)", False, lambda x: F.linear(x, w32)))
    return found


def measure_row_bits(target: torch.nn.Module) -> Generator[Progress, None, RowBits]:
    """For each kernel: the followed row alone, then inside 5 and 16 rows; equal bits or the largest difference."""
    name, layer = _matrix(target)
    yield Progress(0, 1, f"copying {name}'s weight into each kernel's form")
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(max(ROW_COUNTS), layer.in_features, generator=gen)
    checks = []
    kernels = kernels_for(layer)
    with torch.inference_mode():
        for i, (kernel, ours, matmul) in enumerate(kernels):
            yield Progress(i, len(kernels), f"one row alone and in a batch: {kernel}")
            alone = matmul(x[POSITION : POSITION + 1].contiguous())[0]
            for n in ROW_COUNTS:
                inside = matmul(x[:n].contiguous())[POSITION]
                same = torch.equal(alone, inside)
                diff = 0.0 if same else float((alone - inside).abs().max())
                checks.append(RowCheck(kernel, ours, n, same, diff))
    return RowBits(name, tuple(checks))


# ------------------------------------------------------------------------------------------
# llama.cpp's own case: the same prompt read in one batch, and one token at a time
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCase:
    """llama.cpp's greedy text when it reads the prompt in one batch (its default) and one token at a time."""

    version: str
    tokens: int
    one_batch: str
    one_by_one: str

    @property
    def parted_at(self) -> int | None:
        """The first character where the two texts differ (None: the same text)."""
        return first_difference(self.one_batch, self.one_by_one)


def llama_batch_case(peer: Any, prompt: str, tokens: int) -> Generator[Progress, None, BatchCase]:
    """Two greedy llama-completion runs on the target's file: -ub 512 (its default) and -ub 1."""
    from specviz.bench import llama

    yield Progress(0, 2, "llama.cpp reads the prompt in one batch")
    batch = llama.run_plain(peer.build, peer.target, prompt, tokens, peer.threads, ubatch=512)
    yield Progress(1, 2, "llama.cpp reads the prompt one token at a time")
    single = llama.run_plain(peer.build, peer.target, prompt, tokens, peer.threads, ubatch=1)
    return BatchCase(peer.build.version, tokens, batch.text, single.text)
