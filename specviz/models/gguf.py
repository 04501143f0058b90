"""Load a named GGUF pair: each model's cache built when missing (models.cache), then both read from it (models.cached)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from specviz.models import blocks, cache, gguf_model, rowgemm  # cache.ensure_cached is looked up at each call (tests replace it)
from specviz.models.base import LoadProgress, _span
from specviz.models.cached import _load_cached_model, _load_cached_tokenizer
from specviz.models.catalogue import GgufSource
from specviz.models.stream import Form


# ----------------------------------------------------------------------------------------------
# Named GGUF pairs: locate -> join + verify -> dequantize -> save safetensors cache -> load
# ----------------------------------------------------------------------------------------------


def _load_gguf_pair(
    draft_src: GgufSource,
    target_src: GgufSource,
    report: LoadProgress,
    target_dtype: torch.dtype = torch.float32,
    draft_dtype: torch.dtype = torch.float32,
    finish_draft: Callable[[nn.Module], nn.Module] = lambda m: m,
    target_form: Form = "fp32",
    draft_form: Form = "fp32",
    draft_int8_kernel: rowgemm.Kernel | None = None,
) -> tuple[Any, nn.Module, nn.Module]:
    """Build the caches one model at a time (peak RAM: one dequantized model), then load both in their dtypes.

    The draft is loaded and finished (quantized) first, so its fp32 copy is gone before the target
    arrives: the peak is the larger of the fp32 draft and the finished draft plus the target. A draft
    of the same model as an fp32 target reads the target's cache (one folder, quantized at load).
    """
    if draft_src == target_src and target_form == "fp32":
        draft_form = "fp32"
    target_dir = cache.ensure_cached(target_src, _span(report, 0.0, 0.6), target_form)
    draft_dir = cache.ensure_cached(draft_src, _span(report, 0.6, 0.85), draft_form)
    report(0.86, f"loading {draft_src.title} (draft) from the cache")
    if draft_form == "gguf":  # the file's own blocks, mapped (its wider linears as Q4_0): nothing to finish
        draft = gguf_model.load_model(draft_dir, draft_src.title, blocks.required_kernel(), draft=True)
    else:
        # its own copy: safe to quantize; with draft_int8_kernel, its int8 layers come straight in rowgemm's form
        draft = finish_draft(_load_cached_model(draft_dir, draft_src.title, draft_dtype, int8_kernel=draft_int8_kernel))
    report(0.9, f"loading {target_src.title} from the cache")
    tokenizer = _load_cached_tokenizer(target_dir)
    if target_form == "gguf":
        target = gguf_model.load_model(target_dir, target_src.title, blocks.required_kernel())
    else:
        target = _load_cached_model(target_dir, target_src.title, target_dtype, half=target_form == "fp16w")
    return tokenizer, target, draft
