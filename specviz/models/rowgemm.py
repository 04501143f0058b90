"""rowgemm: the target's fp16-weight linears through a small C kernel of our own that reads the weights once for all rows.

Why: see rowgemm.c. The kernel is compiled on first use by the machine's own C compiler (a few seconds) into
the cache folder, keyed by its source, the compiler and the CPU's flags, and loaded with ctypes after torch,
so its OpenMP threads are torch's. Where there is no compiler, or the build or its checks fail, `kernel()`
is None and the callers keep fbgemm (models.half): the app still works, as before.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_SOURCE = Path(__file__).with_suffix(".c")
_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-fno-fast-math")
# the instruction sets a build may target: this CPU's own (what the app uses), and two fixed x86 levels that tests
# build on any x86 machine that runs them, so that each code path of the kernel is checked wherever the suite runs
ISAS = {"native": ("-march=native",), "avx2": ("-march=x86-64-v3",), "portable": ("-march=x86-64",),
        "avx512": ("-march=x86-64-v4",)}  # AVX-512 without VNNI (blockgemm's path for such CPUs)
_ENV_OFF = "SPECVIZ_ROWGEMM"  # SPECVIZ_ROWGEMM=0: never build or use it (fbgemm everywhere, e.g. to compare)


@dataclass(frozen=True)
class Kernel:
    """The loaded kernel: its ctypes function, the vector ISA it was built for, and its panel width."""

    lib: ctypes.CDLL
    isa: str  # "avx512", "avx2" or "portable"
    cols: int  # output columns per panel (the packing's block)
    path: str  # the shared object, for the record

    def linear(self, x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None,
               scale: torch.Tensor | None = None) -> torch.Tensor:
        """x (M, K) fp32 contiguous -> (M, n) fp32 = x @ W.T (* scale) + bias, W held as `panels` (fp16 or int8,
        pack's output; int8 panels need their per-column `scale`)."""
        m, k = x.shape
        y = torch.empty((m, n), dtype=torch.float32)
        fn = self.lib.rowgemm_f16 if panels.dtype == torch.float16 else self.lib.rowgemm_i8
        fn(x.data_ptr(), m, k, panels.data_ptr(), n, 0 if scale is None else scale.data_ptr(),
           0 if bias is None else bias.data_ptr(), y.data_ptr(), n)
        return y


def _cpu_flags() -> str:
    """The CPU's model and flags (what -march=native compiles for): a kernel built on one CPU is never run on another."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = [ln for ln in fh.read().splitlines() if ln.startswith(("model name", "flags"))][:2]
        return "\n".join(lines)
    except OSError:
        return platform.processor() + platform.machine()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build(folder: Path, isa: str = "native", source: Path = _SOURCE, extra: tuple[str, ...] = (),
          headers: tuple[Path, ...] = ()) -> Path | None:
    """The shared object for this source, compiler, ISA and CPU, compiled into `folder` if missing (None: no compiler,
    or it failed). `source`, `extra` flags and the `headers` it includes: another C kernel of the same kind
    (models.blocks builds blockgemm.c)."""
    cc = _compiler()
    if cc is None:
        return None
    flags = (*_FLAGS, *extra, *ISAS[isa])
    texts = [source.read_text(), *(h.read_text() for h in headers)]
    key = hashlib.sha256("\n".join([*texts, cc, *flags, _cpu_flags(), platform.machine()]).encode())
    out = folder / f"{source.stem}-{isa}-{key.hexdigest()[:16]}.so"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        part = Path(tmp) / out.name
        try:
            done = subprocess.run([cc, *flags, "-o", str(part), str(source)], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired):  # a compiler that cannot run here
            return None
        if done.returncode != 0 or not part.is_file():
            return None
        os.replace(part, out)  # atomic: two processes building at once both end with a whole file
    return out


def load(path: Path) -> Kernel:
    import torch  # noqa: F401  (already imported: its libgomp.so.1 is the one the kernel's NEEDED resolves to)

    lib = ctypes.CDLL(str(path))
    lib.rowgemm_isa.restype = ctypes.c_char_p
    lib.rowgemm_cols.restype = ctypes.c_int
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn in (lib.rowgemm_f16, lib.rowgemm_i8):
        fn.argtypes = [ptr, i64, i64, ptr, i64, ptr, ptr, ptr, i64]
        fn.restype = None
    return Kernel(lib, lib.rowgemm_isa().decode(), int(lib.rowgemm_cols()), str(path))


def pack(weight: torch.Tensor, cols: int) -> torch.Tensor:
    """A (N, K) fp16 or int8 weight (any other float dtype becomes fp16) as panels (ceil(N/cols), K, cols) of
    that dtype, zero columns padding the last panel."""
    n, k = weight.shape
    blocks = -(-n // cols)
    w = weight if weight.dtype in (torch.float16, torch.int8) else weight.to(torch.float16)
    if blocks * cols != n:
        w = torch.cat([w, w.new_zeros(blocks * cols - n, k)])
    return w.reshape(blocks, cols, k).transpose(1, 2).contiguous()  # (blocks, K, cols)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (q (N, K) int8, scale (N,) fp32) with weight ≈ q * scale[:, None]."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_(min=1e-12)  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def pack_into(panels: torch.Tensor, weight: torch.Tensor) -> None:
    """`pack` into panels allocated already (a view of a fused group's tensor): no second copy of the weight."""
    blocks, k, cols = panels.shape
    n = weight.shape[0]
    full = n // cols
    panels[:full].copy_(weight[: full * cols].reshape(full, cols, k).transpose(1, 2))
    if full < blocks:  # a last panel only partly filled: zero columns, never written out
        panels[full:].zero_()
        panels[full, :, : n - full * cols].copy_(weight[full * cols :].transpose(0, 1))


def unpack(panels: torch.Tensor, n: int) -> torch.Tensor:
    """The (n, K) fp16 weight back from its panels."""
    blocks, k, cols = panels.shape
    return panels.transpose(1, 2).reshape(blocks * cols, k)[:n]


def folder() -> Path:
    """Where built kernels are kept: the cache's kernels/ folder."""
    from specviz.models.locate import cache_dir

    return cache_dir() / "kernels"


def checks_pass(kern: Kernel) -> bool:
    """The kernel against fp64 arithmetic on the same weights (fp16 and int8 panels), and each row's bits alone vs
    among others: what the app relies on, checked once per process before any model uses it."""
    gen = torch.Generator().manual_seed(0)
    n, k = 200, 300  # not multiples of the panel width or the k chunk
    x = torch.randn(37, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    w16 = (torch.randn(n, k, generator=gen) * 0.05).half()
    q, scale = quantize_rows(torch.randn(n, k, generator=gen))
    for panels, weight, sc in ((pack(w16, kern.cols), w16.double(), None),
                               (pack(q, kern.cols), q.double() * scale.double()[:, None], scale)):
        out = kern.linear(x, panels, n, bias, sc)
        if not within_sum_bound(out, x, weight, bias):
            return False
        alone = torch.cat([kern.linear(x[i : i + 1].contiguous(), panels, n, bias, sc) for i in range(len(x))])
        if not (torch.equal(alone, out) and torch.equal(kern.linear(x[3:20].contiguous(), panels, n, bias, sc), out[3:20])):
            return False
    return True


def within_sum_bound(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `out` is x @ weight.T + bias up to the error bound of an fp32 sum of K products taken one at a time
    (|error| <= (K + 2) u Σ|x w| + u |result|, u = 2^-24): what any correct fp32 kernel meets, a wrong one does not."""
    x64, w64 = x.double(), weight.double()
    exact = x64 @ w64.T + (0.0 if bias is None else bias.double())
    size = x64.abs() @ w64.abs().T + (0.0 if bias is None else bias.double().abs())
    u = 2.0**-24
    return bool(((out.double() - exact).abs() <= (x.shape[1] + 2) * u * size + u * exact.abs()).all())


def built_and_checked(off_switch: str, make: Any, load_it: Any, checks: Any) -> Any:
    """A kernel of ours for this machine: `make()` builds it (a path, or None), `load_it(path)` loads it, `checks(kern)`
    vouches for it; None where the switch `off_switch` is 0, or it cannot be built, loaded or trusted here."""
    if os.environ.get(off_switch, "1").strip() == "0":
        return None
    try:
        path = make()
        if path is None:
            return None
        kern = load_it(path)
        with torch.no_grad():
            return kern if checks(kern) else None
    except (OSError, AttributeError):  # a library that does not load here, or lacks the kernel's functions
        return None


@functools.lru_cache(maxsize=1)
def kernel() -> Kernel | None:
    """The kernel built for this machine, loaded and checked once per process; None where it cannot be had here."""
    return built_and_checked(_ENV_OFF, lambda: build(folder()), load, checks_pass)


class Fused:
    """Linears that share an input (a layer's q, k, v; its gate and up) held as one panel tensor, each layer's own
    panels a view of its slice: one kernel call computes them all. Each output column is its own FMA chain, so the
    call gives every layer the bits its own call would (only the number of kernel calls changes)."""

    def __init__(self, kernel: Kernel, layers: list[torch.nn.Module], panels: torch.Tensor | None = None) -> None:
        """`panels`: the tensor the layers' panels are already views of, in order (allocated before loading); else
        their panels are copied into a new one."""
        self.kernel = kernel
        self.layers = tuple(layers)
        self.sizes = [m.panels.shape[0] * kernel.cols for m in layers]  # each layer's padded width
        self.widths = [m.out_features for m in layers]
        self.panels = panels if panels is not None else torch.cat([m.panels for m in layers])  # (sum of blocks, in, cols)
        self._bias_scale: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
        start = 0
        for m in layers:  # each layer now reads its slice of the one tensor: no second copy of any weight
            blocks = m.panels.shape[0]
            m.panels = self.panels[start : start + blocks]
            m.fused_with = self
            start += blocks

    def bias_scale(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The layers' biases and int8 scales side by side, padded as their panels are (made once, at the first call:
        a group fused before loading has no values yet)."""
        if self._bias_scale is None:
            scales = [getattr(m, "scale", None) for m in self.layers]
            biases = [getattr(m, "bias", None) for m in self.layers]
            scale = None if scales[0] is None else torch.cat([_padded(s, n) for s, n in zip(scales, self.sizes)])
            bias = None if all(b is None for b in biases) else torch.cat(
                [_padded(b.detach().float() if b is not None else torch.zeros(w), n)
                 for b, w, n in zip(biases, self.widths, self.sizes)])
            self._bias_scale = (bias, scale)
        return self._bias_scale

    def __call__(self, x: torch.Tensor, layers: tuple[torch.nn.Module, ...]) -> list[torch.Tensor]:
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        bias, scale = self.bias_scale()
        y = self.kernel.linear(rows, self.panels, sum(self.sizes), bias, scale)  # (M, sum of widths)
        return split_columns(y, x.shape[:-1], self.widths, self.sizes)


def split_columns(y: torch.Tensor, lead: tuple[int, ...], widths: list[int], sizes: list[int]) -> list[torch.Tensor]:
    """A fused call's output (M, sum of sizes) back into each layer's (*lead, width), each layer's block `size` wide.

    Each its own contiguous tensor, as a layer's own call returns: a strided slice can send an elementwise op such as
    SiLU down another code path (a scalar exp in place of the vector one: other last bits)."""
    outs, start = [], 0
    for n, w in zip(sizes, widths):
        outs.append(y[:, start : start + w].contiguous().reshape(*lead, w))
        start += n
    return outs


def _padded(t: torch.Tensor, n: int) -> torch.Tensor:
    return t if len(t) == n else torch.cat([t, t.new_zeros(n - len(t))])


def _groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module, ...]]:
    """Each decoder layer's linears that share an input: (q, k, v) and (gate, up); [] for a model core.lean cannot run."""
    from specviz.core import lean

    if not lean.supports(model):
        return []
    return [group for layer in model.model.layers
            for group in ((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                          (layer.mlp.gate_proj, layer.mlp.up_proj))]


def preallocate(model: torch.nn.Module) -> int:
    """Before an fp16-weight model's weights are read: give each group of its unfilled rowgemm linears one panel
    tensor, each layer's panels a view of its slice, so that loading fills them in place and `fuse` copies nothing
    (fusing after a load held the group twice for a moment and left 40 MB of the old panels in the heap). Returns how
    many groups."""
    from specviz.models.half import HalfLinear

    n = 0
    for group in _groups(model):
        if not all(isinstance(m, HalfLinear) and m.panels is None for m in group):  # unfilled fp16-weight layers only
            continue
        if len({id(m.kernel) for m in group}) != 1 or group[0].kernel is None:
            continue
        cols, k = group[0].kernel.cols, group[0].in_features
        blocks = [-(-m.out_features // cols) for m in group]
        whole = torch.empty((sum(blocks), k, cols), dtype=torch.float16)
        start = 0
        for m, b in zip(group, blocks):
            m.panels = whole[start : start + b]
            start += b
        n += 1
    return n


def fuse(model: torch.nn.Module) -> int:
    """Give each decoder layer's q/k/v and gate/up one panel tensor each (`Fused`) where they are rowgemm layers of
    one kernel, for core.lean's pass (in place where `preallocate` laid them out so, else by copying); returns how many
    groups were fused. Only the number of kernel calls changes."""
    n = 0
    for group in _groups(model):
        kernels = {id(getattr(m, "kernel", None)) for m in group}
        fusable = all(getattr(m, "panels", None) is not None and getattr(m, "ids", None) is None
                      and getattr(m, "fused_with", None) is None for m in group)
        if not fusable or len(kernels) != 1 or len({m.panels.dtype for m in group}) != 1:
            continue
        base = group[0].panels
        laid_out = base._base is not None and all(m.panels._base is base._base for m in group) and \
            group[0].panels.data_ptr() == base._base.data_ptr() and sum(m.panels.shape[0] for m in group) == base._base.shape[0]
        Fused(group[0].kernel, list(group), base._base if laid_out else None)
        n += 1
    return n
