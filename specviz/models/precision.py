"""Precision of the target and the draft: what each costs, which keeps the promise, and the default picked by measuring.

The promise of the app is that greedy speculative output equals the target's own greedy output.
That needs the target's arithmetic to give each position the same logits whether the position is
scored alone (a target-only step) or among the k+1 rows of a verify pass. fp32 keeps this in
practice (row differences ~1e-6); bf16, fp16 and dynamic int8 do not: their per-row results depend
on the pass shape (bf16 up to 2e-4, and int8 computes one activation scale for the whole pass), so
where the target's top two tokens are that close the two runs pick differently. fp16 *weights* with
fp32 arithmetic (models.half) keep it: each row is computed alone, padded to row counts measured to
agree. So the *target* default on a CPU is fp16w where its kernels work, unless fp32 runs clearly faster
(fp16w takes half the memory), else fp32 where it fits; the draft (whose precision never touches the promise)
gets whatever is measured fastest here.
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from specviz.core.limits import DRAFT_PRECISIONS, TARGET_PRECISIONS
from specviz.models import half
from specviz.models.base import PairError, _first_line, pack_threads
from specviz.models.packed import PackedLinear, layers_of, plain_linear

BIT_EXACT: frozenset[str] = frozenset({"gguf", "fp32", "fp16w"})  # target precisions whose greedy output keeps the promise here
DTYPES: dict[str, torch.dtype] = {"gguf": torch.float32, "fp32": torch.float32, "fp16w": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
# bytes per weight: int8 and fp16w change nn.Linear only; the embedding stays fp32 (see weight_bytes)
_BYTES = {"gguf": 0.6, "fp32": 4.0, "fp16w": 2.0, "bf16": 2.0, "int8": 1.0}
_CLEAR_WIN = 0.8  # bf16 must beat the alternative by this factor: one noisy probe on a shared CPU must not flip the choice
# and fp32 must beat fp16w by it to be the default target: on a 2-core AMX Xeon one row took 0.9-1.4 ms either way and
# the order flipped between processes, and a class server that drew fp32 held 7.4 GB and served 30 pupils 5x slower
_FIT_SHARE = 0.6  # the fp32 pair must fit in this share of the machine's RAM (the OS, the app and the KV caches need the rest)
# fp16w is the default only for targets at least this big in fp32: a step of a small target (SmolLM2-135M: 0.5 GB)
# is bound by per-layer overhead, not by reading weights, so halving them buys little and changes its numbers
_HALF_FROM = 1 << 30


@dataclass(frozen=True)
class Probe:
    """One quick measurement of this machine: a target-shaped matmul in fp32, bf16 and int8 (CPU)."""

    device: str  # "cpu" or "cuda"
    native_bf16: bool  # the CPU reports avx512_bf16 or amx_bf16 (or a CUDA GPU supports bf16)
    shape: tuple[int, int]  # (in, out) of the timed matmul: the target's MLP up-projection
    fp32_ms: float  # best of a few, one row (a target-only step)
    bf16_ms: float
    int8_ms: float | None  # per-channel dynamic int8 (CPU only; None on CUDA)
    ram_bytes: int  # total memory of the machine (or of the GPU)
    fp16w_ms: float | None = None  # fp16 weights, fp32 arithmetic (models.half; None where it does not work)

    @property
    def bf16_speedup(self) -> float:
        return self.fp32_ms / self.bf16_ms if self.bf16_ms > 0 else 0.0


@dataclass(frozen=True)
class PrecisionChoice:
    """Target and draft precision of one load, and why (shown on stderr, in JSON and in the sidebar)."""

    target: str  # "fp32", "bf16" or "int8"
    draft: str
    target_default: bool  # True when the target precision was picked here, not asked for
    draft_default: bool
    reason: str  # one line: what was measured and why this choice

    @property
    def bit_exact(self) -> bool:
        """Whether greedy speculative output is promised identical to the target's own greedy output."""
        return self.target in BIT_EXACT


def native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (avx512_bf16 or AMX); without them bf16 is emulated."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
    except OSError:  # not Linux: ask oneDNN (it checks the same instructions)
        return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _ram_bytes(device: str) -> int:
    """Total memory the models live in: the GPU's, or the machine's."""
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 16 << 30


def _best_ms(fn, repeats: int = 5) -> float:
    """Best wall time of `fn()` in ms after one warm-up call (best, not mean: other processes share the CPU)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t) * 1000.0)
    return best


def _best_ms_interleaved(a, b, repeats: int = 7) -> tuple[float, float]:
    """Best wall times of `a()` and `b()` in ms, timed turn about, so that a busy CPU slows both alike."""
    a(), b()
    best_a = best_b = float("inf")
    for _ in range(repeats):
        best_a = min(best_a, _best_ms(a, 1))
        best_b = min(best_b, _best_ms(b, 1))
    return best_a, best_b


def _int8_linear(layer: torch.nn.Linear) -> torch.nn.Module:
    """A per-channel dynamic int8 copy of one linear layer (PairError where torch lacks int8)."""
    return quantize_int8(torch.nn.Sequential(layer))[0]


# Linears left in fp32 by int8 quantization. Dynamic int8 quantizes a layer's *input* too, with one scale for
# the whole tensor; the input of an MLP's down projection (SiLU(gate)·up) carries a few huge channels, so one
# scale wipes out the rest. Measured on SmolLM2-135M (story preset, T 0.8, 40 positions): mean Σmin(p, q)
# 0.43 with every Linear in int8, 0.71 with down_proj kept in fp32, 0.96 for int8 weights alone.
FP32_LINEARS = ("down_proj",)


def int8_linears(model: torch.nn.Module) -> set[str]:
    """Names of the Linears int8 quantization covers (all but the FP32_LINEARS)."""
    return {name for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] not in FP32_LINEARS}


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Per-channel int8 dynamic quantization of the nn.Linears (down projections stay fp32), in place on the
    model's own copy.

    A tied lm_head is replaced by a quantized module holding a packed int8 copy; the fp32 embedding
    it was tied to is left untouched, and no other model's tensor is shared. The layers are converted
    as torch's quantize_dynamic converts them (the same from_float, so the same bits), on a few threads:
    fbgemm's packing runs on one core (Qwen2.5 0.5B: 13 s alone, 7.6 s on 2 cores).
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig
    from torch.ao.quantization.quantization_mappings import get_default_dynamic_quant_module_mappings

    mapping = get_default_dynamic_quant_module_mappings()  # what quantize_dynamic swaps: Linear subclasses stay fp32

    def convert(name: str) -> tuple[str, torch.nn.Module]:
        layer = model.get_submodule(name)
        quantized = mapping.get(type(layer))
        if quantized is None:
            return name, layer
        layer.qconfig = per_channel_dynamic_qconfig
        with torch.no_grad():  # grad mode is per thread
            return name, quantized.from_float(layer)

    with warnings.catch_warnings():  # torch.ao.quantization is deprecated but still the tool for this
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        try:
            with ThreadPoolExecutor(max_workers=pack_threads(), thread_name_prefix="specviz-int8") as pool:
                for name, layer in pool.map(convert, sorted(int8_linears(model))):
                    model.set_submodule(name, layer)  # the fp32 weight goes as its int8 copy arrives
        except (RuntimeError, AssertionError) as e:
            raise PairError(f"int8 quantization is not available here ({_first_line(e)}): use precision fp32") from e
    return model.eval()


_TWINS: weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module] = weakref.WeakKeyDictionary()
_TWINS_LOCK = threading.Lock()


def batch_variant_twin(model: torch.nn.Module) -> torch.nn.Module:
    """An int8-dynamic twin of an fp32 or fp16w CPU model, for the lesson "the promise needs the same arithmetic".

    Dynamic int8 picks one activation scale for the whole pass, so a token's logits depend on the
    other tokens scored with it: a verify pass and a one-token step no longer agree. The twin shares
    every tensor int8 does not replace (embedding, norms, the fp32 down projections) with `model`, so
    it costs only its int8 weights (about a quarter of the fp32 Linears), and it lives as long as
    `model` does (one per model, made on first use).
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        raise PairError("the int8 twin needs an fp32 target on the CPU (dynamic int8 runs on CPUs only)")
    with _TWINS_LOCK:  # two pupils asking at once must not quantize twice
        twin = _TWINS.get(model)
        if twin is None:
            tensors = itertools.chain(model.parameters(), model.buffers(),
                                      (m.packed for m in model.modules() if isinstance(m, PackedLinear)))
            shared = {id(t): t for t in tensors}
            with torch.no_grad():
                twin = copy.deepcopy(model, memo=shared)
                _quantize_packed(twin)
                twin = quantize_int8(twin).eval()
            _TWINS[model] = twin
        return twin


def _quantize_packed(model: torch.nn.Module) -> None:
    """Give a copy's packed and fp16-weight linears (models.packed, models.half) int8 modules from their weights, one at
    a time; FP32_LINEARS stay shared."""
    for parent, name, child in [*layers_of(model, PackedLinear), *layers_of(model, half.HalfLinear)]:
        if name not in FP32_LINEARS:
            setattr(parent, name, _int8_linear(child.to_linear()))  # a new plain weight; the packed one stays shared


@functools.lru_cache(maxsize=8)
def probe(device: str = "cpu", shape: tuple[int, int] = (1536, 8960)) -> Probe:
    """Time one row through a (in, out) matmul in each precision; cached per process (about 0.3 s on a CPU)."""
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(shape[1], shape[0], generator=gen).to(device)  # (out, in)
    x32 = torch.randn(1, shape[0], generator=gen).to(device)  # (1, in)
    w16, x16 = w32.bfloat16(), x32.bfloat16()

    def timed(x: torch.Tensor, w: torch.Tensor) -> float:
        def run() -> None:
            torch.nn.functional.linear(x, w)
            if device == "cuda":
                torch.cuda.synchronize()
        return _best_ms(run)

    with torch.no_grad():  # not inference_mode: quantize_dynamic needs version counters
        fp32_ms, bf16_ms = timed(x32, w32), timed(x16, w16)
        int8_ms = fp16w_ms = None
        if device == "cpu" and half.half_works():
            layer = half.HalfLinear(w32, None)
            # against fp32 turn about: the default target depends on this comparison, so a busy CPU must not flip it
            fp32_ms, fp16w_ms = _best_ms_interleaved(lambda: torch.nn.functional.linear(x32, w32), lambda: layer(x32))
        if device == "cpu":
            try:
                q = _int8_linear(plain_linear(w32))
                int8_ms = _best_ms(lambda: q(x32))
            except PairError:  # this torch has no int8 kernels here
                pass
    native = torch.cuda.is_bf16_supported() if device == "cuda" else native_bf16()
    return Probe(device, bool(native), shape, fp32_ms, bf16_ms, int8_ms, _ram_bytes(device), fp16w_ms)


def weight_bytes(params: int, embed_params: int, precision: str) -> int:
    """Bytes of a model's weights in a precision (int8 and fp16w keep the input embedding in fp32)."""
    if precision in ("int8", "fp16w"):
        return int((params - embed_params) * _BYTES[precision] + embed_params * _BYTES["fp32"])
    return int(params * _BYTES[precision])


def choose(
    device: str,
    target_fp32_bytes: int,
    draft_fp32_bytes: int,
    target: str | None = None,
    draft: str | None = None,
    draft_fallback: str = "int8",
    gguf_here: bool = False,
) -> PrecisionChoice:
    """Fill in the precisions not asked for: the target keeps the promise where it can, the draft runs fastest.

    Target: on a CPU, fp16w (fp16 weights, fp32 arithmetic: bit-exact, half the memory) for a target
    of 1 GB or more in fp32 where its kernels work here, unless a measured fp32 row runs clearly faster (by
    `_CLEAR_WIN`) and the fp32 pair fits; else fp32 when the fp32 pair fits in
    60 % of the memory, else bf16 (marked not bit-exact). bf16 is faster only with native bf16
    instructions, and even there it breaks the promise (see the module docstring); it stays one click away.
    A named GGUF pair on a CPU where blockgemm runs (`gguf_here`) takes gguf first: its file's own blocks, a
    third of fp16w's bytes a step and still its own target's greedy output.
    Draft: on CUDA half precision; on a CPU the faster of int8 (per channel) and bf16 as measured,
    or `draft_fallback` where the pair asks for fp32 (models whose layers int8 cannot cover).
    """
    check(target, draft)
    why: list[str] = []
    chosen_target = target
    if chosen_target is None and gguf_here and draft in (None, "gguf"):
        chosen_target = "gguf"
        why.append("target gguf: its GGUF file's own 4-bit blocks (blockgemm), the fastest exact target here")
    if chosen_target == "gguf" and draft in (None, "gguf"):
        # nothing to weigh: the draft follows the target onto its own file's blocks, and the probe's fp32, bf16 and
        # int8 timings (a second or two of a start) would decide nothing
        why.append("draft gguf: its own GGUF file's blocks (at most 4.5 bits a weight), as the target")
        return PrecisionChoice("gguf", "gguf", target is None, draft is None, "; ".join(why))
    pr = probe(device)
    fits = target_fp32_bytes + draft_fp32_bytes <= _FIT_SHARE * pr.ram_bytes
    if chosen_target is None:
        fp32_clearly_faster = pr.fp16w_ms is not None and pr.fp32_ms < _CLEAR_WIN * pr.fp16w_ms
        if pr.fp16w_ms is not None and target_fp32_bytes >= _HALF_FROM and (not fp32_clearly_faster or not fits):
            chosen_target = "fp16w"
            why.append("target fp16w: half the memory, " + ("not clearly slower than fp32 here, " if fits else
                       f"as the fp32 pair does not fit ({_gb(target_fp32_bytes + draft_fp32_bytes)} of {_gb(pr.ram_bytes)}), ")
                       + "and greedy output stays identical")
        else:
            chosen_target = "fp32" if fits else "bf16"
            why.append(
                "target fp32: keeps greedy output identical" if fits else
                f"target bf16: the fp32 pair needs {_gb(target_fp32_bytes + draft_fp32_bytes)} of {_gb(pr.ram_bytes)}"
            )
    chosen_draft = draft
    if chosen_draft is None and chosen_target == "gguf":  # a target on its file's blocks: the draft on its own file's
        chosen_draft = "gguf"
        why.append("draft gguf: its own GGUF file's blocks (at most 4.5 bits a weight), as the target")
    if chosen_draft is None:
        chosen_draft = _fastest_draft(pr, draft_fallback)
        why.append(f"draft {chosen_draft}: " + ("half precision on CUDA" if device == "cuda" else
                   "the pair's own" if draft_fallback != "int8" else "faster here" if chosen_draft == "bf16" else
                   "int8 unless native bf16 is clearly faster"))
    native = "native bf16" if pr.native_bf16 else "no native bf16 (emulated)"
    int8 = f", int8 {pr.int8_ms:.2f} ms" if pr.int8_ms is not None else ""
    int8 += f", fp16w {pr.fp16w_ms:.2f} ms" if pr.fp16w_ms is not None else ", no fp16w kernels"
    measured = f"{device}, {native}; one {pr.shape[0]}×{pr.shape[1]} row: fp32 {pr.fp32_ms:.2f} ms, bf16 {pr.bf16_ms:.2f} ms{int8}"
    return PrecisionChoice(chosen_target, chosen_draft, target is None, draft is None, "; ".join([*why, measured]))


def check(target: str | None, draft: str | None) -> None:
    """ValueError naming the allowed values when a precision asked for is unknown (None = choose here)."""
    for name, value, allowed in (("target", target, TARGET_PRECISIONS), ("draft", draft, DRAFT_PRECISIONS)):
        if value is not None and value not in allowed:
            raise ValueError(f"{name} precision must be one of {', '.join(allowed)}, not {value!r}")


def _fastest_draft(pr: Probe, fallback: str) -> str:
    """Half precision on CUDA; on a CPU int8 unless bf16 measured faster; `fallback` when the pair rules int8 out."""
    if pr.device == "cuda":
        return "bf16"
    if fallback != "int8":  # the pair asked for fp32 (int8 does not cover its layers): keep it, predictable
        return fallback
    bf16_wins = pr.native_bf16 and pr.bf16_ms < _CLEAR_WIN * min(pr.fp32_ms, pr.int8_ms or pr.fp32_ms)
    if pr.int8_ms is None:
        return "bf16" if bf16_wins else "fp32"
    return "bf16" if bf16_wins else "int8"


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"


def describe(precision: str) -> str:
    """The label of a target precision in a select box: whether it keeps the promise here."""
    if precision == "fp16w":
        return "fp16w" if half.half_works() else "fp16w (unavailable here)"  # bit-exact like fp32: no note (the box is narrow)
    return precision if precision in BIT_EXACT else f"{precision} (not bit-exact here)"
