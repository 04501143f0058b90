"""Pre-packed CPU linears: the target's matrices reordered once at load for oneDNN, so a verify pass costs little more than a step.

Why: torch's plain CPU linear re-packs the weight on every call, and for a few rows (a verify pass of
4 to 17 tokens) that costs 3-4x one row here (a 1.5B fp32 target: 1.47 s for 4 new tokens vs 0.46 s
for 1). oneDNN's inner product over a weight reordered once at load (what torch.compile's CPU
freezing does with `mkldnn._reorder_linear_weight`) costs 1.0-1.25x one row's time for 4 rows and
~1.7-1.8x for 16-17 (`python -m specviz why-cheap`), and on the CPUs measured here it computes every row the same way whatever the number of
rows, bit for bit: a token's logits no longer depend on how many tokens were scored with it in the
linears. Both facts are measured on the machine (`packing_works`) before any model is packed; where
they do not hold (no oneDNN, another CPU), the model keeps torch's plain linears.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

_PROBE_ROWS = (1, 2, 3, 5, 9, 17)  # the pass shapes a step, a chain and a tree verify use


class PackedLinear(torch.nn.Module):
    """An nn.Linear whose weight is held in oneDNN's reordered layout (the plain copy is released)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        # the batch-size hint only picks a layout; every hint >1 measured gives the same per-row results
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 4)
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def unpacked_weight(self) -> torch.Tensor:
        """The weight in the plain layout (a new tensor: for copies such as the int8 twin)."""
        return self.packed.to_dense()

    def to_linear(self) -> torch.nn.Linear:
        """A plain nn.Linear with this layer's weight (a new tensor) and bias (shared)."""
        return plain_linear(self.unpacked_weight(), self.bias)

    def __deepcopy__(self, memo: dict) -> "PackedLinear":
        """A copy sharing what `memo` already maps (as copy.deepcopy does for parameters), cloning the rest."""
        new = PackedLinear.__new__(PackedLinear)
        memo[id(self)] = new
        torch.nn.Module.__init__(new)
        new.out_features, new.in_features, new.dtype = self.out_features, self.in_features, self.dtype
        new.packed = _shared_or_clone(self.packed, memo)
        new.register_buffer("bias", None if self.bias is None else _shared_or_clone(self.bias, memo), persistent=False)
        return new

    def nbytes(self) -> int:
        return self.out_features * self.in_features * self.packed.element_size()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {self.dtype}"


def _shared_or_clone(t: torch.Tensor, memo: dict) -> torch.Tensor:
    return memo[id(t)] if id(t) in memo else t.clone()


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Linear:
    """An nn.Linear holding these tensors (no copy)."""
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype, device=weight.device)
    layer.weight.data = weight
    if bias is not None:
        layer.bias.data = bias
    return layer


def _rows_agree(layer: torch.nn.Module, gen: torch.Generator, counts: tuple[int, ...] = _PROBE_ROWS) -> bool:
    """Whether a layer (packed here, or models.half's fp16-weight one) gives each row the same bits at every pass size in `counts`."""
    rows = torch.randn(1, max(counts), layer.in_features, generator=gen).to(layer.dtype)
    alone = [layer(rows[:, i : i + 1])[0, 0] for i in range(max(counts))]
    for n in counts:
        out = layer(rows[:, :n])[0]
        if not all(torch.equal(out[i], alone[i]) for i in range(n)):
            return False
    return True


@functools.lru_cache(maxsize=4)
def packing_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether packed linears run here, agree with torch's linear and are row-invariant (a 0.1 s check on a small matrix)."""
    if not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(384, 256, generator=gen).to(dtype)
    bias = torch.randn(384, generator=gen).to(dtype)
    x = torch.randn(1, 1, 256, generator=gen).to(dtype)
    try:
        with torch.no_grad():
            layer = PackedLinear(weight, bias)
            close = torch.allclose(layer(x).float(), torch.nn.functional.linear(x, weight, bias).float(), rtol=1e-2, atol=1e-2)
            return close and _rows_agree(layer, gen)  # a wrong result is worse than a slow one
    except (RuntimeError, NotImplementedError):  # no oneDNN kernel for this dtype or CPU
        return False


def layers_of(model: torch.nn.Module, kind: type) -> list[tuple[torch.nn.Module, str, Any]]:
    """(parent, attribute, layer) of every submodule of exactly this type (not subclasses: int8 linears are Linears)."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if type(child) is kind]


def packing_enabled() -> bool:
    """False where the operator set SPECVIZ_PACKED=0 (torch's plain linears everywhere, e.g. to compare)."""
    return os.environ.get("SPECVIZ_PACKED", "1").strip() != "0"


def describe(n_packed: int) -> str:
    """One line for the precision note: which matrix kernels the target got."""
    if n_packed:
        return f"target linears packed for oneDNN at load ({n_packed}; each row the same bits at any pass size here)"
    if not packing_enabled():
        return "torch's plain linears (SPECVIZ_PACKED=0)"
    return "torch's plain linears (packed ones are unavailable or not row-invariant here)"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of a CPU model by a PackedLinear, one at a time (peak memory: one extra matrix).

    First each distinct matrix shape is checked for row invariance on its first real layer (a packed
    copy, dropped after); if any shape fails, the model keeps torch's linears. Returns how many were
    packed (0 where none). A head tied to the embedding gets its own packed copy.
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or not packing_enabled() or not packing_works(first.dtype):
        return 0
    layers = layers_of(model, torch.nn.Linear)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        by_shape = {child.weight.shape: child for _, _, child in layers}
        if not all(_rows_agree(PackedLinear(c.weight, c.bias), gen) for c in by_shape.values()):
            return 0
        del by_shape, first
        return replace_each(layers, lambda child: PackedLinear(child.weight, child.bias))


def replace_each(layers: list[tuple[torch.nn.Module, str, Any]], make: Any) -> int:
    """Put `make(layer)` in each layer's place, one at a time, and return how many.

    The list is emptied as it goes, so each old layer (and its weight) is released as soon as its
    replacement is in place: the peak is one extra matrix, never a second model.
    """
    n = len(layers)
    while layers:
        parent, name, child = layers.pop(0)
        setattr(parent, name, make(child))
        del child
    return n


def unpack_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a model's PackedLinears back into nn.Linears, in place (for tools that look for nn.Linear)."""
    for parent, name, child in layers_of(model, PackedLinear):
        setattr(parent, name, child.to_linear())
    return model


def packed_bytes(model: torch.nn.Module) -> int:
    """Bytes of the packed weights (they are neither parameters nor buffers)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, PackedLinear))


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
