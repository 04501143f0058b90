"""Load a named GGUF pair: each model's cache built when missing (models.cache), then both read from it (models.cached)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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
    if target_form == draft_form == "gguf":
        target_dir, draft_dir = ensure_gguf_forms(draft_src, target_src, _span(report, 0.0, 0.85))
    else:
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


def ensure_gguf_forms(draft_src: GgufSource, target_src: GgufSource, report: LoadProgress) -> tuple[Path, Path]:
    """Both models' gguf cache forms (target's, draft's), built side by side where missing.

    A gguf form dequantizes nothing (its peak memory is a few hundred MB), and its build is hashing the parts
    and reading the tokenizer from the file, one core's work each: two builds at once take the time of the
    longer one on a 2-core machine (a first start's 30 s of joining and tokenizers become about 20). The bar
    shows both builds' progress together, weighed by their numbers of parts.
    """
    if draft_src == target_src:
        folder = cache.ensure_cached(target_src, report, "gguf")
        return folder, folder
    ahead = _AHEAD.get(_ahead_key(draft_src, target_src))
    if ahead is None:
        return _build_both(draft_src, target_src, report)
    report = _forward_only(report)  # the forms found below would start the bar again from nothing
    ahead.follow(report)  # built ahead while the kernel compiled: wait for it, showing its progress
    return _build_both(draft_src, target_src, report)  # found (or, had it failed, built here, saying why not)


def _forward_only(report: LoadProgress) -> LoadProgress:
    """`report`, its fraction never going back (the largest so far)."""
    top = [0.0]

    def forward(fraction: float, message: str) -> None:
        top[0] = max(top[0], fraction)
        report(top[0], message)
    return forward


def _build_both(draft_src: GgufSource, target_src: GgufSource, report: LoadProgress) -> tuple[Path, Path]:
    """ensure_gguf_forms' work: the two forms' builds in two threads, one bar."""
    joint = _JointProgress(report, (len(target_src.parts), len(draft_src.parts)))
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="gguf-form") as pool:
        target = pool.submit(cache.ensure_cached, target_src, joint.part(0), "gguf")
        draft = pool.submit(cache.ensure_cached, draft_src, joint.part(1), "gguf")
        return target.result(), draft.result()


class _JointProgress:
    """One bar for several jobs running at once: the weighted sum of their fractions, with the latest message."""

    def __init__(self, report: LoadProgress, weights: tuple[int, ...]) -> None:
        total = sum(weights) or 1
        self.report, self.weights = report, [w / total for w in weights]
        self.done = [0.0] * len(weights)
        self.lock = threading.Lock()  # the jobs report from their own threads

    def part(self, i: int) -> LoadProgress:
        def report(fraction: float, message: str) -> None:
            with self.lock:
                self.done[i] = min(max(fraction, self.done[i]), 1.0)  # never backwards
                self.report(sum(w * f for w, f in zip(self.weights, self.done)), message)
        return report


class _Ahead:
    """Both gguf forms of a pair being built in the background, and whoever waits for them (build_ahead)."""

    def __init__(self, draft_src: GgufSource, target_src: GgufSource) -> None:
        self.lock = threading.Lock()
        self.latest: tuple[float, str] = (0.0, f"{target_src.title}: looking for its parts")
        self.listener: LoadProgress | None = None
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gguf-ahead")
        self.future = pool.submit(_build_both, draft_src, target_src, self._report)
        pool.shutdown(wait=False)  # the thread ends with its build

    def _report(self, fraction: float, message: str) -> None:
        with self.lock:
            self.latest, listener = (fraction, message), self.listener
        if listener is not None:
            listener(fraction, message)

    def follow(self, report: LoadProgress) -> None:
        """Relay the build's progress to `report` until it ends, whether it succeeded or not."""
        with self.lock:
            self.listener = report
            fraction, message = self.latest
        report(fraction, message)
        try:
            self.future.exception()  # waits; a failure is met again, and said, by the caller's own build
        finally:
            with self.lock:
                self.listener = None


def _ahead_key(draft_src: GgufSource, target_src: GgufSource) -> tuple[Any, ...]:
    return draft_src, target_src, str(cache.cache_dir())  # another cache folder (SPECVIZ_CACHE) is another build


_AHEAD: dict[tuple[Any, ...], _Ahead] = {}
_AHEAD_LOCK = threading.Lock()


def build_ahead(draft_src: GgufSource, target_src: GgufSource) -> None:
    """Start building the pair's gguf forms in the background where they are missing (once per process and pair).

    Called while the blockgemm kernel compiles and checks itself (a first start's 6-8 s on 2 cores), whose answer
    decides whether the default precision is gguf at all: the forms are hashing and tokenizer reading, one core
    each, and a compiler uses one. The load that follows waits for them with their progress (ensure_gguf_forms).
    """
    if all(cache._cache_is_valid(cache.cache_folder(src, "gguf"), src, "gguf") for src in (draft_src, target_src)):
        return
    with _AHEAD_LOCK:
        key = _ahead_key(draft_src, target_src)
        if key not in _AHEAD or _AHEAD[key].future.done():
            _AHEAD[key] = _Ahead(draft_src, target_src)
