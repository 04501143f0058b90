"""Timing and memory helpers every measurement shares (the labs, the benchmark, the batch measurement): where a
measurement runs, one timed pass, whether repeats were disturbed, and whether a batch fits in memory."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from specviz.core.kv import CachedLM

Ids = Sequence[int]

# Slowest ÷ fastest above this means something else used the machine while it was timed: repeats of one
# measurement (the labs), or the steps of one target-only run (the Watch page). Alone on a quiet machine they differ
# by a few %; a busy laptop (a video call, a projector's driver, a CPU hog on one core) stretches some 2-3 times.
NOISY_SPREAD = 1.5
MEMORY_RESERVE = 1 << 30  # bytes a batch must leave free: the app, the browser and other sessions share RAM


def spread(times: Sequence[Sequence[float]]) -> float:
    """The worst slowest ÷ fastest ratio among repeated timings (1.0 = perfectly steady)."""
    return max((max(t) / min(t) for t in times if t and min(t) > 0), default=1.0)


@dataclass(frozen=True)
class Machine:
    """Where a measurement ran: the same code gives CPU figures here and GPU figures elsewhere."""

    device: str  # "cpu" or "cuda"
    name: str  # CPU model or GPU name
    threads: int  # torch intra-op threads (CPU) — the compute a pass can use here


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_of(device: torch.device) -> Machine:
    """The machine a measurement runs on, in a few words."""
    if device.type == "cuda":
        return Machine("cuda", torch.cuda.get_device_name(device), torch.get_num_threads())
    return Machine("cpu", f"{cpu_model()}, {os.cpu_count()} logical cores", torch.get_num_threads())


def sync(device: torch.device) -> None:
    """GPU kernels run asynchronously: wait for them so the clock measures the pass, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefilled(model: torch.nn.Module, ids: Ids) -> CachedLM:
    """A run's own cache of `model` holding `ids` (prefilled once, through the engine's pass, as a run's prompt is)."""
    lm = CachedLM(model)
    lm.logits(list(ids), 1)
    return lm


def timed_pass_ms(lm: CachedLM, new_ids: Sequence[int]) -> float:
    """Milliseconds of one engine pass (core.forward, what runs use) over `new_ids` after the cached ids, with logits
    at every new position, as a verify pass needs them (the LM head is part of the cost); the cache is cropped back."""
    held = list(lm.ids)
    device = lm.device
    sync(device)
    t0 = time.perf_counter()
    lm.logits(held + list(new_ids), len(new_ids))
    sync(device)
    ms = (time.perf_counter() - t0) * 1000.0
    lm.crop(len(held))
    return ms


def dims(model_config: Any) -> dict[str, int]:
    cfg = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    return {
        "layers": int(cfg.num_hidden_layers), "heads": heads, "hidden": hidden,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or hidden // heads),
        "inter": int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
        "vocab": int(cfg.vocab_size),
    }


def batch_bytes(model_config: Any, batch: int, new_tokens: int, context: int, dtype_bytes: int = 4) -> int:
    """A generous estimate of the memory one pass at this batch size allocates (the weights are shared).

    KV cache for the batch, plus hidden states, MLP activations, attention scores and logits of the
    new tokens, doubled for temporaries alive at the same time.
    """
    d = dims(model_config)
    seq = context + new_tokens
    kv = 2 * d["layers"] * batch * d["kv_heads"] * d["head_dim"] * seq * dtype_bytes
    act = batch * new_tokens * (4 * d["hidden"] + 3 * d["inter"] + d["vocab"]) * 4
    attn = batch * d["heads"] * new_tokens * seq * 4
    return kv + 2 * (act + attn)


def available_bytes(device: torch.device) -> int:
    """Free memory where the batch would live: RAM (psutil) on CPU, free GPU memory on CUDA."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def memory_problem(need: int, free: int, batch: int) -> str | None:
    """Why a batch must not be allocated (None when it fits with the reserve left free)."""
    if need + MEMORY_RESERVE <= free:
        return None
    return (f"batch {batch} would need about {need / 2**20:,.0f} MB plus a {MEMORY_RESERVE / 2**20:,.0f} MB reserve, "
            f"but only {free / 2**20:,.0f} MB is free: stopped there")
