"""One pass of a Llama-family model (Qwen2, Llama, SmolLM2) written out with torch ops, as gpt-fast's model.py does:
transformers' own arithmetic, op for op, without its per-call machinery.

Why: on a CPU a small model's step is partly Python. transformers' modules add decorators, keyword plumbing,
mask building and output records to every layer: about 0.35 ms a layer here, 8 of a 0.5B draft step's 20 ms.
This pass calls the same modules' weights through the same torch functions in the same order (the same RMSNorm
expression, rotary tables, `sdpa_attention_forward`, SiLU), so every row gets the bits transformers' forward
gives it (tests/test_lean.py holds them equal), and it calls a layer's projections that share an input in one
kernel call where they are rowgemm panels side by side (`fuse`). Any other model family takes transformers'
forward: `supports` says which.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from specviz.core import profile
from specviz.core.attend import attend

_FAMILIES = ("qwen2", "llama")  # decoder layers of the same shape: RMSNorm, rotary q/k, GQA attention, SiLU-gated MLP


def supports(model: torch.nn.Module) -> bool:
    """Whether this model's pass can be written out here: a Llama-family causal LM with plain rotary embeddings."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _FAMILIES:
        return False
    rope = getattr(config, "rope_parameters", None) or {}
    inner = getattr(model, "model", None)
    return (rope.get("rope_type", "default") in ("default", "llama3", "linear") and inner is not None
            and hasattr(inner, "rotary_emb") and getattr(config, "hidden_act", "silu") == "silu"
            and not getattr(config, "use_sliding_window", False))


def enabled(model: torch.nn.Module) -> bool:
    """`supports`, unless the operator turned it off (SPECVIZ_LEAN=0: transformers' forward everywhere, to compare)."""
    return os.environ.get("SPECVIZ_LEAN", "1").strip() != "0" and supports(model)


GLUE = "glue_kernel"  # a model whose norms, rotary and gate run as one kernel call each (models.blocks: gguf models)


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor, glue: Any = None) -> torch.Tensor:
    """transformers' Qwen2RMSNorm / LlamaRMSNorm, the same expression (one call of `glue`'s where the model has it)."""
    if glue is not None and x.shape[-1] % 16 == 0:  # the kernel's sum runs in 16 lanes
        return glue.rms_norm(x, norm.weight, norm.variance_epsilon)
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotary(model: torch.nn.Module, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, N, head_dim) of the positions (1, N): the model's rotary module's forward, the same expression."""
    rotary = model.model.rotary_emb
    freqs = positions[..., None].float() * rotary.inv_freq.to(dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rotary.attention_scaling).to(dtype), (emb.sin() * rotary.attention_scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _projections(layers: Sequence[torch.nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """Each layer applied to x; one kernel call for all where they are fused panels (see `fuse`)."""
    fused = getattr(layers[0], "fused_with", None)
    if fused is not None and all(getattr(m, "fused_with", None) is fused for m in layers):
        return fused(x, layers)
    return [m(x) for m in layers]


def _attention(attn: torch.nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, feeds: Sequence[Any],
               spans: Sequence[tuple[int, int]], layer_idx: int, laps: Any, glue: Any = None) -> torch.Tensor:
    """transformers' attention block for every feed's rows, each run over its own cache and mask: (1, N, hidden)."""
    shape = (*h.shape[:-1], -1, attn.head_dim)
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    q, k, v = _projections(projections, h)
    laps.matmul("q/k/v", projections)
    if glue is not None:  # q and k are this call's own tensors: turned in place, one call each
        q, k = glue.rotary_(q.view(shape), cos, sin).transpose(1, 2), glue.rotary_(k.view(shape), cos, sin).transpose(1, 2)
        v = v.view(shape).transpose(1, 2)
    else:
        q, k, v = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * c) + (_rotate_half(q) * s)
        k = (k * c) + (_rotate_half(k) * s)
    laps("norms, rotary, activation")
    outs = []
    for (a, b), feed in zip(spans, feeds):
        keys, values = feed.cache.update(k[:, :, a:b], v[:, :, a:b], layer_idx)
        laps("kv cache")
        outs.append(attend(attn, q[:, :, a:b], keys, values, feed.mask, dropout=0.0,
                           scaling=attn.scaling, sliding_window=getattr(attn, "sliding_window", None)))
        laps("attention")
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # (1, N, heads, head_dim)
    out = out.reshape(*h.shape[:-1], -1).contiguous()
    laps("attention")
    out = attn.o_proj(out)
    laps.matmul("o", attn.o_proj)
    return out


def _mlp(mlp: torch.nn.Module, h: torch.Tensor, laps: Any, glue: Any = None) -> torch.Tensor:
    projections = (mlp.gate_proj, mlp.up_proj)
    fused = getattr(mlp.gate_proj, "fused_with", None)
    if glue is not None and fused is not None and getattr(mlp.up_proj, "fused_with", None) is fused:
        joined = fused.joined(h)  # (M, 2I): gate's columns, then up's
        laps.matmul("gate/up", projections)
        h = glue.silu_mul(joined, mlp.gate_proj.out_features).reshape(*h.shape[:-1], -1)
        laps("norms, rotary, activation")
        out = mlp.down_proj(h)
        laps.matmul("down", mlp.down_proj)
        return out
    gate, up = _projections(projections, h)
    laps.matmul("gate/up", projections)
    h = mlp.act_fn(gate) * up
    laps("norms, rotary, activation")
    out = mlp.down_proj(h)
    laps.matmul("down", mlp.down_proj)
    return out


@torch.inference_mode()
def run(model: torch.nn.Module, feeds: Sequence[Any], ids: torch.Tensor, positions: torch.Tensor,
        spans: Sequence[tuple[int, int]], keep: torch.Tensor,
        want_hidden: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """(logits at the `keep` rows (1, K, V), transformers' `hidden_states` tuple or ()) of one packed pass."""
    laps = profile.laps()  # the round profile's lap timers (nothing while no profile records)
    inner = model.model
    x = inner.embed_tokens(ids)  # (1, N, hidden)
    cos, sin = _rotary(model, positions, x.dtype)
    laps("embedding")
    hidden = [x] if want_hidden else None
    glue = getattr(model, GLUE, None)
    for i, layer in enumerate(inner.layers):
        h = _rms_norm(layer.input_layernorm, x, glue)
        laps("norms, rotary, activation")
        x = x + _attention(layer.self_attn, h, cos, sin, feeds, spans, i, laps, glue)
        h = _rms_norm(layer.post_attention_layernorm, x, glue)
        laps("norms, rotary, activation")
        x = x + _mlp(layer.mlp, h, laps, glue)
        if hidden is not None and i < len(inner.layers) - 1:
            hidden.append(x)
        laps("residual")
    x = _rms_norm(inner.norm, x, glue)
    if hidden is not None:
        hidden.append(x)
    laps("norms, rotary, activation")
    logits = model.lm_head(x[:, keep, :])
    laps.matmul("output layer", model.lm_head)
    return logits, tuple(hidden) if hidden is not None else ()

