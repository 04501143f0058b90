"""The draft's int8 weights with fp32 activations (rowgemm): a quarter of fp32's bytes, and no activation scale to lose.

Why: a draft step is bound by reading its weights, like the target's, and its guesses need not be the
target's bits, only good. torch's dynamic int8 (fbgemm) also quantizes each pass's activations with one
scale, which wipes out the small channels beside an MLP's few huge ones (so the down projections were
kept in fp16), and its per-call quantization costs more than the small matrices of a 0.5B draft take to
read. Here every linear keeps per-output-row int8 weights and computes in fp32 (rowgemm's int8 panels,
the row's scale applied once at the end): the down projections can be int8 too, and the draft's output
layer can keep only the rows of a reduced vocabulary (core.draft_vocab): its other logits are -inf, so q
is 0 there exactly, and the rule stays exact (a token the target wants outside it comes from the residual).
"""

from __future__ import annotations

import torch
from torch import nn

from specviz.models import half, rowgemm, stream
from specviz.models.packed import layers_of

_BLOCK_ROWS = 4096  # rows quantized at a time: no fp32 copy of a whole output layer


class Int8WLinear(nn.Module):
    """An nn.Linear held as per-row int8 weights in rowgemm panels; input, bias and output fp32.

    With `ids` (ascending vocabulary ids) it keeps only those rows of the weight and writes the others' outputs
    as -inf: the output layer over a reduced vocabulary.
    """

    dtype = torch.float32

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, kernel: rowgemm.Kernel,
                 ids: torch.Tensor | None = None) -> None:
        """q (V, in) int8 and scale (V,) of every row (weight = q * scale[:, None]); `ids` the rows to keep."""
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.kernel = kernel
        self.ids = ids  # (N,) int64 or None: all rows
        self.panels = rowgemm.pack(q if ids is None else q[ids], kernel.cols)  # (ceil(N/64), in, 64) int8
        self.scale = (scale if ids is None else scale[ids]).float().contiguous()  # (N,)
        self.bias = None if bias is None else (bias.detach().float() if ids is None else bias.detach().float()[ids])

    @property
    def rows_kept(self) -> int:
        return self.out_features if self.ids is None else len(self.ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        y = self.kernel.linear(rows, self.panels, self.rows_kept, self.bias, self.scale)  # (M, N)
        if self.ids is not None:  # the reduced output layer: every other logit is -inf (q = 0 there)
            full = torch.full((len(rows), self.out_features), float("-inf"))
            y = full.index_copy_(1, self.ids, y)
        return y.reshape(*x.shape[:-1], self.out_features)

    def nbytes(self) -> int:
        return self.rows_kept * self.in_features + 4 * self.rows_kept

    def extra_repr(self) -> str:
        kept = "" if self.ids is None else f", {len(self.ids)} rows kept"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights (rowgemm){kept}"


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rowgemm.quantize_rows a block of rows at a time (an fp32 temporary of _BLOCK_ROWS rows at most)."""
    parts = [rowgemm.quantize_rows(weight[i : i + _BLOCK_ROWS]) for i in range(0, weight.shape[0], _BLOCK_ROWS)]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def _int8_of(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, scale, bias) of a linear in any of the forms a draft arrives in: a dynamic int8 layer's own per-channel
    symmetric int8 values as they are (the same weights as before); a plain or fp16-weight one quantized per row."""
    if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):
        weight, bias = layer._packed_params._weight_bias()
        if weight.qscheme() in (torch.per_channel_symmetric, torch.per_channel_affine) and \
                not bool(weight.q_per_channel_zero_points().any()):
            return weight.int_repr(), weight.q_per_channel_scales().float(), bias
        q, scale = _quantize(weight.dequantize())
        return q, scale, bias
    weight = layer.unpacked_weight() if isinstance(layer, half.HalfLinear) else layer.weight.detach().float()
    q, scale = _quantize(weight)
    return q, scale, layer.bias


def int8w_from_parts(ints: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bias: torch.Tensor | None,
                     kernel: rowgemm.Kernel) -> Int8WLinear:
    """The Int8WLinear that int8w_linears makes of the dynamic int8 layer a cache's parts would become
    (stream.int8_from_parts), without making that layer: fbgemm packed each of the 0.5B draft's 145 layers at its load
    only for int8w_linears to unpack it again (4.3 + 3.4 s of a 28 s load on the Ice Lake Xeon). The same values: a
    symmetric layer's int8 values and scales as they are; any other (never written by quantize_int8's caches) still
    goes through the dynamic layer, whose packing rounds its scales, so that it gets the very bits it got before."""
    if not bool(zeros.any()):
        return Int8WLinear(ints, scales.float(), bias, kernel)
    return Int8WLinear(*_int8_of(stream.int8_from_parts(ints, scales, zeros, bias)), kernel)


def int8w_linears(model: nn.Module, kernel: rowgemm.Kernel, vocab_ids: torch.Tensor | None = None) -> int:
    """Replace every linear of a draft (plain, fp16-weight or dynamic int8) by an Int8WLinear, one at a time; the
    output layer keeps only `vocab_ids` where given. Returns how many."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    kinds = (nn.Linear, half.HalfLinear, torch.ao.nn.quantized.dynamic.Linear)
    layers = [entry for kind in kinds for entry in layers_of(model, kind)]
    with torch.no_grad():
        for parent, name, child in layers:
            q, scale, bias = _int8_of(child)
            setattr(parent, name, Int8WLinear(q, scale, bias, kernel, vocab_ids if child is head else None))
    return len(layers)


def int8w_bytes(model: nn.Module) -> int:
    """Bytes of the int8 weights and scales (held in panels: neither parameters nor buffers)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, Int8WLinear))
