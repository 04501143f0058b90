"""Attention of a pass's rows, each row computed alone where a model asks for it: the same call, shapes and bits as a one-token step.

Why: torch's sdpa on a CPU gives a query row other last bits when other rows share its call (5 rows against 1:
up to 6e-7 here). For fp32 or fp16 weights that stays noise, but a model whose linears quantize their activations
(models.blocks: int8 per block) can round a value the other way on such a difference, and the logits then part by
tenths. So such a model's attention modules carry `rows_alone`, and each of their rows attends alone: its query,
and the keys and values it may see gathered in position order (what a step of that token would hold), with no
mask: exactly a one-token step's call. Where the module also carries the model's blockgemm kernel (`ROW_KERNEL`),
one call of its attention (models/blockgemm_attend.h) computes every row and head alone by construction, each row
over the keys it may see in position order: the same bits as that row's own step, without a call per row.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ROWS_ALONE = "rows_alone"  # the attribute an attention module carries when each of its rows must attend alone
ROW_KERNEL = "row_kernel"  # and the kernel that attends all of them in one call, each alone (where it has one)


def attend(module: torch.nn.Module, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
           mask: torch.Tensor | None, **kwargs: Any) -> torch.Tensor:
    """sdpa of query (1, heads, n, d) over keys/values (1, kv_heads, kv, d) under `mask` (additive (1, 1, n, kv), or
    None: causal after the cache) -> (1, n, heads, d); row by row where the module carries `rows_alone`."""
    n = query.shape[2]
    if not getattr(module, ROWS_ALONE, False):
        return sdpa_attention_forward(module, query, keys, values, mask, **kwargs)[0]
    kv = keys.shape[2]
    kernel = getattr(module, ROW_KERNEL, None)
    if kernel is not None and query.shape[-1] % 16 == 0 and not kwargs.get("dropout") and \
            kwargs.get("sliding_window") is None and kwargs.get("scaling") is not None:
        seen = None if mask is None else mask[0, 0] == 0
        return kernel.attend(query, keys, values, seen, float(kwargs["scaling"]))
    outs = []
    for r in range(n):
        if mask is None:  # causal: row r sees everything up to its own position
            seen = torch.arange(kv - n + r + 1, device=keys.device)
        else:
            seen = (mask[0, 0, r] == 0).nonzero().reshape(-1)
        k, v = keys.index_select(2, seen), values.index_select(2, seen)  # (1, kv_heads, seen, d), fresh and contiguous
        outs.append(sdpa_attention_forward(module, query[:, :, r : r + 1].contiguous(), k, v, None, **kwargs)[0])
    return outs[0] if n == 1 else torch.cat(outs, dim=1)


def mark(model: torch.nn.Module, kernel: Any = None) -> int:
    """Give every attention module of `model` `rows_alone` (and `kernel`, a models.blocks kernel, to attend them in one
    call); returns how many."""
    n = 0
    for m in model.modules():
        if hasattr(m, "q_proj") and hasattr(m, "o_proj"):
            setattr(m, ROWS_ALONE, True)
            setattr(m, ROW_KERNEL, kernel)
            n += 1
    return n
