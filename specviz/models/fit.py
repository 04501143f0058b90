"""Fit before load: a pair's memory estimated from measured figures, safetensors headers or config.json, against free RAM.

Nothing here downloads or loads weights: a folder is read for its config.json and the JSON
header at the start of each .safetensors file (a few kilobytes); a hub id is asked only for
its safetensors headers, and only on the command line or for pairs the operator allowed.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specviz import host
from specviz.models.base import PairError
from specviz.models.hub import _parse_hf

log = logging.getLogger("specviz.models")

GIB = 1 << 30
FP32 = 4  # bytes per weight: every model is loaded in fp32 (the int8 draft is quantized after loading)
# What one `load_pair(NAME)` from the cache adds to a process: peak RSS of a fresh process that loads it,
# less what importing torch and transformers already holds (the check runs in such a process).
# Measured on this project's 2-core CPU machine on 2026-12-01 with
#   python -c "import resource; from specviz.models import load_pair; load_pair('NAME');
#              print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, 'MB')"
# which printed 385 MB (tiny-random: almost all of it the imports), 1940 MB and 11312 MB (fp32 target); with the
# fp16w target (load_pair('qwen-coder', target_precision='fp16w'), the default where it is faster) 4146 MB.
BASE_MB = 385
MEASURED_PEAK: dict[str, int] = {
    "tiny-random": 64 << 20,
    "smollm2-135m": (1940 - BASE_MB) << 20,
    "qwen-coder": (11312 - BASE_MB) << 20,  # 10263 MB resident once loaded (the draft quantized to int8)
    "qwen-coder@fp16w": (4146 - BASE_MB) << 20,  # fp16 weights streamed in, embeddings mapped from the cache
}
LOAD_FACTOR = 1.25  # peak ÷ fp32 weights while from_pretrained reads a folder (buffers, the tied head)
RUNTIME = GIB // 2  # Python, torch, tokenizer and a KV cache for a short demo run
MAX_HEADER = 100 << 20  # a safetensors JSON header larger than this is not a model file
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1}


class DoesNotFit(PairError):
    """A pair that needs more memory than this machine has free; the message is one safe line."""


@dataclass(frozen=True)
class Need:
    """A pair's estimated peak memory while loading, and how it was estimated."""

    bytes: int
    how: str  # "measured", "safetensors headers", "safetensors index", "config.json", "hub headers"


def gb(n: int) -> str:
    return f"{n / GIB:.1f} GB"


# ------------------------------------------------------------------------------------------
# One model: parameter count without loading it
# ------------------------------------------------------------------------------------------


def safetensors_elements(path: Path) -> int:
    """Number of weights in one .safetensors file, from its JSON header only."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= MAX_HEADER:
            raise ValueError(f"{path.name}: not a safetensors header")
        header = json.loads(f.read(size))
    return sum(math.prod(int(d) for d in t.get("shape", ())) for k, t in header.items()
               if k != "__metadata__" and isinstance(t, dict))


def _config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def config_elements(cfg: dict[str, Any]) -> int | None:
    """A decoder-only transformer's weights from its config (embeddings, attention, MLP, head)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    h = text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    vocab = text.get("vocab_size")
    if not (isinstance(h, int) and isinstance(layers, int) and isinstance(vocab, int)):
        return None
    inner = text.get("intermediate_size") or text.get("n_inner") or 4 * h
    mlp = (3 if "intermediate_size" in text else 2) * h * int(inner)  # gated MLPs have three matrices
    head = 0 if text.get("tie_word_embeddings", True) else vocab * h
    return vocab * h + head + layers * (4 * h * h + mlp)


def folder_need(folder: Path) -> Need | None:
    """fp32 bytes of the model in `folder`: safetensors headers, else their index, else config.json."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return Need(sum(safetensors_elements(f) for f in files) * FP32, "safetensors headers")
    cfg = _config(folder)
    try:
        index = json.loads((folder / "model.safetensors.index.json").read_text(encoding="utf-8"))
        stored = int(index["metadata"]["total_size"])
        width = DTYPE_BYTES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), 4)
        return Need(stored // width * FP32, "safetensors index")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    elements = config_elements(cfg)
    return Need(elements * FP32, "config.json") if elements else None


def hub_need(repo_id: str) -> Need | None:
    """fp32 bytes of a hub model from its safetensors headers (HTTP range reads, no weights); None offline."""
    try:
        from huggingface_hub import get_safetensors_metadata

        meta = get_safetensors_metadata(repo_id)
        return Need(sum(int(n) for n in meta.parameter_count.values()) * FP32, "hub headers")
    except Exception as exc:  # noqa: BLE001 - offline, private or odd repos: the loader says what is wrong
        log.info("no size estimate for a hub model: %s", exc)
        return None


# ------------------------------------------------------------------------------------------
# A pair, and the check
# ------------------------------------------------------------------------------------------


def estimate(name: str, precision: str | None = None) -> Need | None:
    """A pair's peak load memory with this target precision (None when it cannot be told without loading)."""
    if f"{name}@{precision}" in MEASURED_PEAK:
        return Need(MEASURED_PEAK[f"{name}@{precision}"], "measured")
    if name in MEASURED_PEAK:  # the fp32 figure: an upper bound for the smaller precisions
        return Need(MEASURED_PEAK[name], "measured")
    if not name.startswith("hf:"):
        return None
    needs = []
    for ref in _parse_hf(name):
        folder = Path(ref)
        need = folder_need(folder) if folder.is_dir() else hub_need(ref)
        if need is None:
            return None
        needs.append(need)
    weights = sum(n.bytes for n in needs)
    return Need(int(weights * LOAD_FACTOR) + RUNTIME, " + ".join(sorted({n.how for n in needs})))


def available_bytes() -> int:
    """RAM this process can still take without swapping or meeting its container's limit (free plus reclaimable caches)."""
    return host.read_limits().memory_available


def check_fit(name: str, available: Callable[[], int] = available_bytes, precision: str | None = None) -> Need | None:
    """Refuse (DoesNotFit, one line, no path) a pair that cannot fit in the free memory; else its estimate."""
    need = estimate(name, precision)
    if need is None:
        log.info("pair %s: memory not estimated before loading", name)
        return None
    free = available()
    log.info("pair %s needs about %s (%s); %s free", name, gb(need.bytes), need.how, gb(free))
    if need.bytes > free:
        raise DoesNotFit(f"This model pair needs about {gb(need.bytes)} of memory to load and this machine has "
                         f"{gb(free)} free: choose a smaller pair, or close other programs first.")
    return need


# ------------------------------------------------------------------------------------------
# The pair a visitor starts on: the default where it fits this machine, else the light one
# ------------------------------------------------------------------------------------------

LIGHT_PAIR = "smollm2-135m"  # about 2 GB at its load peak: runs on any school laptop
DEFAULT_SHARE = 0.8  # the default pair's load peak must fit in this share of the machine's memory (OS and browser need the rest)


def total_bytes() -> int:
    """All the RAM this process may use: the machine's, or its container's limit (the default pair must fit that, not a moment's free memory)."""
    return host.read_limits().memory_total


@dataclass(frozen=True)
class StartPair:
    """The pair the app starts on here, and why it is not the preferred one (None when it is)."""

    pair: str
    note: str | None


def start_pair(preferred: str, total: Callable[[], int] | None = None, light: str = LIGHT_PAIR,
               precision: str | None = None) -> StartPair:
    """`preferred` where its measured load peak (with this target precision) fits in 80 % of this machine's memory,
    else the light pair, with why."""
    need = estimate(preferred, precision)
    have = (total or total_bytes)()
    if need is None or need.bytes <= DEFAULT_SHARE * have or preferred == light:
        return StartPair(preferred, None)
    return StartPair(light, f"The app started on the light pair: {preferred} needs about {gb(need.bytes)} of memory "
                            f"to load and this machine has {gb(have)} in all. {preferred} stays in the list.")
