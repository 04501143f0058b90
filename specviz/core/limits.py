"""Every range and name a setting may take, and the one check of each: the CLI, the app's settings and the labs use these (drafters: `core.drafters`)."""

from __future__ import annotations

import math
from typing import Literal

DEFAULT_GAMMA = 4  # the draft length every run, lab and command starts from (a chain of 4 guesses, then one check)
GAMMA_RANGE = (1, 16)  # draft length γ: tokens guessed per round (the ceiling when adaptive)
MAX_NEW_MIN = 1  # new tokens: the engine's floor; the pair's context is the CLI's only ceiling
APP_MAX_NEW_RANGE = (1, 256)  # the app's slider: 256 plain target steps of the 1.5B model take about 2 minutes on a CPU
TEMPERATURE_RANGE = (0.05, 2.0)  # the app's slider; the engine only needs > 0 and finite
TOP_P_RANGE = (0.05, 1.0)  # the app's slider; the engine accepts (0, 1]
SEED_RANGE = (0, 2**31 - 1)  # a torch.Generator seed the app's number box and URLs may carry
SAMPLES_RANGE = (100, 5000)  # the Same answer lab: draws per method (fewer cannot reject anything)
SAMPLE_TOKENS_RANGE = (1, 3)  # the Same answer lab: how many next tokens one sample is made of
REPEATS_RANGE = (1, 15)  # the Why checking is cheap lab: timed passes per point (median reported)
MODES = ("greedy", "sample")  # argmax, or a draw from the tempered distribution
Precision = Literal["gguf", "fp32", "fp16w", "bf16", "int8"]  # how a model's weights are held (specviz.models.precision loads them)
# fp16w: fp16 weights in the linears, fp32 arithmetic everywhere (models.half; CPUs with fbgemm only)
# gguf: the linears and embedding on the GGUF file's own quantized blocks (models.blocks; GGUF pairs on a CPU)
TARGET_PRECISIONS: tuple[Precision, ...] = ("gguf", "fp32", "fp16w", "bf16", "int8")
DRAFT_PRECISIONS: tuple[Precision, ...] = ("gguf", "int8", "bf16", "fp32")


def check_within(what: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{what} must be in {lo}..{hi}, got {value}")


def check_gamma(gamma: int) -> None:
    check_within("gamma (draft length)", gamma, *GAMMA_RANGE)


def check_max_new_tokens(n: int) -> None:
    if n < MAX_NEW_MIN:
        raise ValueError(f"max_new_tokens must be >= {MAX_NEW_MIN}, got {n}")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be 'greedy' or 'sample', not {mode!r}")


def check_temperature(mode: str, temperature: float) -> None:
    """Sampling divides the logits by it: > 0 and finite (greedy ignores it, but never a nan or inf)."""
    if mode == "sample" and not temperature > 0:  # also refuses nan
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number, got {temperature}")


def check_top_p(top_p: float) -> None:
    if not 0 < top_p <= 1:
        raise ValueError(f"top-p must be in (0, 1], got {top_p}")


def check_top_k(top_k: int) -> None:
    if top_k < 0:
        raise ValueError(f"top-k must be >= 0 (0 = off), got {top_k}")


def check_sampling(mode: str, temperature: float, top_p: float, top_k: int) -> None:
    """The decoding settings the engine can honour (the app's sliders are narrower, see the ranges above)."""
    check_mode(mode)
    check_temperature(mode, temperature)
    check_top_p(top_p)
    check_top_k(top_k)


def check_samples(n_samples: int, n_tokens: int) -> None:
    """The Same answer lab's sample count: at least 1 (the lab's own tests use few), at most SAMPLES_RANGE's top,
    enforced here on the server and not only by the page's slider."""
    check_within("tokens per sample", n_tokens, *SAMPLE_TOKENS_RANGE)
    if not 1 <= n_samples <= SAMPLES_RANGE[1]:
        raise ValueError(f"the number of samples must be in 1..{SAMPLES_RANGE[1]}, got {n_samples}")


def check_repeats(repeats: int, warmup: int = 0) -> None:
    check_within("repeats", repeats, *REPEATS_RANGE)
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
