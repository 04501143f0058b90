"""What a loaded model's weights are: the bytes they hold and the matrix kernel they run on (pages and --json say it)."""

from __future__ import annotations

import collections

import torch
from torch import nn

from specviz.models import blocks, half, int8w, packed


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's weights as held now (packed, fp16 and int8 weights counted from their layers' shapes)."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return (total + packed.packed_bytes(model) + half.half_bytes(model) + _int8_bytes(model) + int8w.int8w_bytes(model)
            + blocks.block_bytes(model))


def kernel_of(model: nn.Module) -> str:
    """Which matrix kernel a model's linears run on, in a few words (the page and --json say it): the kind most of them
    use, e.g. "rowgemm avx512, fp16 weights" or "fbgemm, int8 dynamic"."""
    kinds: collections.Counter[str] = collections.Counter()
    for m in model.modules():
        if isinstance(m, half.HalfLinear):
            kinds[f"rowgemm {m.kernel.isa}, fp16 weights" if m.panels is not None else "fbgemm, fp16 weights"] += 1
        elif isinstance(m, blocks.BlockLinear):
            kinds[f"blockgemm {m.kernel.isa}, {blocks.TYPE_NAMES.get(m.qtype, m.qtype)} blocks"] += 1
        elif isinstance(m, int8w.Int8WLinear):
            kinds[f"rowgemm {m.kernel.isa}, int8 weights"] += 1
        elif isinstance(m, packed.PackedLinear):
            kinds[f"oneDNN, {str(m.dtype).removeprefix('torch.')}"] += 1
        elif isinstance(m, torch.ao.nn.quantized.dynamic.Linear):
            kinds["fbgemm, int8 dynamic"] += 1
        elif type(m) is nn.Linear:
            kinds[f"torch, {str(m.weight.dtype).removeprefix('torch.')}"] += 1
    return kinds.most_common(1)[0][0] if kinds else "none"


def _int8_bytes(model: nn.Module) -> int:
    """Bytes of the dynamically quantized linears' int8 weights and fp32 biases, from their shapes: unpacking them to
    count would copy them (0.26 GB of resident memory for the Qwen 0.5B draft, kept by the heap afterwards)."""
    return sum(m.in_features * m.out_features + 4 * m.out_features
               for m in model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear))
