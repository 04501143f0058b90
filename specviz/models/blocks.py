"""gguf weights: a model's linears and embedding run on its GGUF file's own quantized blocks, through blockgemm.

Why: a CPU step reads every weight once, so its time is the bytes it reads; the 1.5B target's Q4_K_M file holds
1.1 GB where fp16 weights are 3.1 GB. blockgemm (models/blockgemm.c, our own) computes x @ W.T from the blocks as
the file stores them, each activation row quantized alone and every block's dot product an exact integer, then
the floats in one fixed order: a row's bits are the same alone or among any others, on every instruction-set path
(see the C file). Built at first use like rowgemm, one shared object per path: the CPU's own ("native", what the
app runs), and the fixed AVX2 and portable levels the tests build wherever they run.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specviz.models import rowgemm

_SOURCE = Path(__file__).with_name("blockgemm.c")
_EXTRA = ("-ffp-contract=off",)  # the vector and scalar paths must round alike: no fused multiply-adds anywhere
_ENV_OFF = "SPECVIZ_BLOCKGEMM"  # SPECVIZ_BLOCKGEMM=0: never build or use it (the gguf precision is then refused)
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # ggml's ids
TYPE_NAMES = {v: k for k, v in TYPES.items()}


@dataclass(frozen=True)
class BlockKernel:
    """The loaded kernel: its ctypes functions and the instruction-set path it was built for."""

    lib: ctypes.CDLL
    isa: str  # "avx512-vnni", "avx512", "avx2" or "portable"
    path: str  # the shared object, for the record

    def __deepcopy__(self, memo: dict) -> "BlockKernel":
        return self  # functions, no state: a copied model (precision's int8 twin) shares its kernel

    def block_bytes(self, qtype: int) -> int:
        return int(self.lib.blockgemm_block_bytes(qtype))

    def block_size(self, qtype: int) -> int:
        return int(self.lib.blockgemm_block_size(qtype))

    def linear(self, qtype: int, blocks: torch.Tensor, k: int, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x (M, K) fp32 contiguous -> (M, N) fp32 = x @ W.T + bias, W's N rows held as `blocks` (N, row bytes) uint8."""
        m = x.shape[0]
        n, row_bytes = blocks.shape
        y = torch.empty((m, n), dtype=torch.float32)
        code = self.lib.blockgemm_linear(qtype, blocks.data_ptr(), row_bytes, n, k, x.data_ptr(), m,
                                         0 if bias is None else bias.data_ptr(), y.data_ptr(), n)
        if code != 0:
            raise ValueError(f"blockgemm cannot run a {TYPE_NAMES.get(qtype, qtype)} matrix of {n} rows of {k} "
                             f"({row_bytes} bytes a row) on {m} rows")
        return y

    def x16(self, qtype: int, blocks: torch.Tensor, k: int) -> torch.Tensor | None:
        """The matrix repacked 16 rows side by side (blockgemm_x16.h: Q4_K and Q6_K with rows a multiple of 16), every
        bit kept; None for any other type or shape (the rows' own blocks serve then)."""
        n, row_bytes = blocks.shape
        size = int(self.lib.blockgemm_x16_size(qtype, n, k))
        if size == 0:
            return None
        out = torch.empty(size, dtype=torch.uint8)
        if self.lib.blockgemm_repack_x16(qtype, blocks.data_ptr(), row_bytes, n, k, out.data_ptr()):
            return None
        return out

    def linear_x16(self, qtype: int, packed: torch.Tensor, n: int, k: int, x: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
        """`linear` on a matrix repacked by `x16` (its own float order: see blockgemm_x16.h)."""
        m = x.shape[0]
        y = torch.empty((m, n), dtype=torch.float32)
        if self.lib.blockgemm_linear_x16(qtype, packed.data_ptr(), n, k, x.data_ptr(), m,
                                         0 if bias is None else bias.data_ptr(), y.data_ptr(), n):
            raise ValueError(f"blockgemm cannot run a repacked {TYPE_NAMES.get(qtype, qtype)} matrix of {n} rows of {k}")
        return y

    def requantize_q4_0(self, qtype: int, blocks: torch.Tensor, k: int) -> torch.Tensor:
        """The matrix's rows as Q4_0 blocks (N, k/32 * 18): its floats (gguf's dequantization) quantized as gguf's
        Q4_0 does, bit for bit (blockgemm_rows.h). 4.5 bits a weight: for a draft, whose bits only move its guesses."""
        n, row_bytes = blocks.shape
        out = torch.empty((n, k // 32 * 18), dtype=torch.uint8)
        if self.lib.blockgemm_requantize_q4_0(qtype, blocks.data_ptr(), row_bytes, n, k, out.data_ptr()):
            raise ValueError(f"blockgemm cannot requantize a {TYPE_NAMES.get(qtype, qtype)} matrix of {n} rows of {k}")
        return out

    def attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, seen: torch.Tensor | None,
               scaling: float) -> torch.Tensor:
        """Attention of query (1, H, n, d) over keys/values (1, G, kv, d), each row and head alone (blockgemm_attend.h):
        `seen` (n, kv) bool, or None for causal after the cache -> (1, n, H, d) fp32."""
        _, heads, n, d = query.shape
        groups, kv = keys.shape[1], keys.shape[2]
        q, k, v = (t.float().contiguous() for t in (query, keys, values))
        mask = None if seen is None else seen.to(torch.uint8).contiguous()
        out = torch.empty((1, n, heads, d), dtype=torch.float32)
        if self.lib.blockgemm_attend(q.data_ptr(), heads, n, d, k.data_ptr(), v.data_ptr(), groups, kv,
                                     0 if mask is None else mask.data_ptr(), scaling, out.data_ptr()):
            raise ValueError(f"blockgemm cannot attend {n} rows of {heads} heads of width {d} over {kv} keys "
                             f"({groups} key heads)")
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """transformers' RMSNorm of each row of x (..., n) fp32, one call (blockgemm_glue.h)."""
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        out = torch.empty_like(rows)
        if self.lib.blockgemm_rms_norm(rows.data_ptr(), rows.shape[0], rows.shape[1], weight.float().contiguous().data_ptr(),
                                       eps, out.data_ptr()):
            raise ValueError(f"blockgemm's RMSNorm needs a width that is a multiple of 16, not {rows.shape[1]}")
        return out.reshape(x.shape)

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (1, N, heads, d), fp32 and contiguous, rotated in place at its rows' positions (cos, sin (1, N, d))."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError("blockgemm's rotary turns a contiguous fp32 tensor in place")
        n, heads, d = x.shape[1], x.shape[2], x.shape[3]
        c, s = cos.float().contiguous(), sin.float().contiguous()
        if self.lib.blockgemm_rotary(x.data_ptr(), n, heads, d, c.data_ptr(), s.data_ptr()):
            raise ValueError(f"blockgemm's rotary cannot turn a head of width {d}")
        return x

    def silu_mul(self, gate_up: torch.Tensor, width: int) -> torch.Tensor:
        """silu(gate) * up of a fused call's output (M, 2 * width), gate first -> (M, width), one call."""
        y = gate_up.contiguous()
        out = torch.empty((y.shape[0], width), dtype=torch.float32)
        self.lib.blockgemm_silu_mul(y.data_ptr(), y.data_ptr() + 4 * width, y.shape[0], width, y.shape[1], out.data_ptr())
        return out

    def rows(self, qtype: int, blocks: torch.Tensor, k: int, ids: torch.Tensor) -> torch.Tensor:
        """The weights of rows `ids` as fp32 (len(ids), K), as gguf's dequantization gives them."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        n = blocks.shape[0]
        if len(flat) and not (0 <= int(flat.min()) and int(flat.max()) < n):
            raise IndexError(f"a row id is outside the matrix's {n} rows")
        out = torch.empty((len(flat), k), dtype=torch.float32)
        if self.lib.blockgemm_rows(qtype, blocks.data_ptr(), blocks.shape[1], k, flat.data_ptr(), len(flat), out.data_ptr()):
            raise ValueError(f"blockgemm cannot read {TYPE_NAMES.get(qtype, qtype)} rows of {k}")
        return out


def load(path: Path) -> BlockKernel:
    import torch  # noqa: F401  (already imported: its libgomp.so.1 is the one the kernel's NEEDED resolves to)

    lib = ctypes.CDLL(str(path))
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.blockgemm_isa.restype = ctypes.c_char_p
    lib.blockgemm_block_bytes.argtypes = lib.blockgemm_block_size.argtypes = [i32]
    lib.blockgemm_block_bytes.restype = lib.blockgemm_block_size.restype = i32
    lib.blockgemm_linear.argtypes = [i32, ptr, i64, i64, i64, ptr, i64, ptr, ptr, i64]
    lib.blockgemm_linear.restype = i32
    lib.blockgemm_rows.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr]
    lib.blockgemm_rows.restype = i32
    lib.blockgemm_requantize_q4_0.argtypes = [i32, ptr, i64, i64, i64, ptr]
    lib.blockgemm_requantize_q4_0.restype = i32
    lib.blockgemm_attend.argtypes = [ptr, i64, i64, i64, ptr, ptr, i64, i64, ptr, ctypes.c_float, ptr]
    lib.blockgemm_attend.restype = i32
    f32 = ctypes.c_float
    lib.blockgemm_rms_norm.argtypes = [ptr, i64, i64, ptr, f32, ptr]
    lib.blockgemm_rotary.argtypes = [ptr, i64, i64, i64, ptr, ptr]
    lib.blockgemm_silu_mul.argtypes = [ptr, ptr, i64, i64, i64, ptr]
    lib.blockgemm_rms_norm.restype = lib.blockgemm_rotary.restype = lib.blockgemm_silu_mul.restype = i32
    lib.blockgemm_x16_size.argtypes = [i32, i64, i64]
    lib.blockgemm_x16_size.restype = i64
    lib.blockgemm_repack_x16.argtypes = [i32, ptr, i64, i64, i64, ptr]
    lib.blockgemm_repack_x16.restype = i32
    lib.blockgemm_linear_x16.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr, ptr, i64]
    lib.blockgemm_linear_x16.restype = i32
    return BlockKernel(lib, lib.blockgemm_isa().decode(), str(path))


def build(isa: str = "native") -> Path | None:
    """The shared object for this CPU and path, compiled into the cache's kernels/ folder if missing."""
    headers = tuple(_SOURCE.with_name(name) for name in ("blockgemm_blocks.h", "blockgemm_x16.h", "blockgemm_rows.h",
                                                        "blockgemm_attend.h", "blockgemm_glue.h"))
    return rowgemm.build(rowgemm.folder(), isa, _SOURCE, _EXTRA, headers)


_SCALE_AT = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}  # fp16 fields of a block


def random_blocks(kern: BlockKernel, qtype: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """(n, row bytes) uint8 blocks of `qtype`: random quants, sub-block scales and signs (every byte random), the
    block's fp16 scales set to sane values (random bytes there could be inf or nan). For checks and tests."""
    bb, bs = kern.block_bytes(qtype), kern.block_size(qtype)
    raw = torch.randint(0, 256, (n, k // bs, bb), generator=gen, dtype=torch.uint8)
    for at in _SCALE_AT[qtype]:
        scale = (torch.rand(n, k // bs, generator=gen) * 0.002 + 1e-4).half()  # (n, blocks)
        raw[:, :, at : at + 2] = scale.view(torch.uint8).reshape(n, k // bs, 2)
    return raw.reshape(n, -1).contiguous()


def checks_pass(kern: BlockKernel) -> bool:
    """Each type once against the float reference (the blocks dequantized by the kernel itself, the activations
    quantized as it does), as stored and 16 rows side by side, and each row's bits alone vs among others: checked
    once per process before any model."""
    gen = torch.Generator().manual_seed(0)
    for name in ("Q4_K", "Q6_K", "Q8_0", "Q4_0"):
        qtype = TYPES[name]
        bs = kern.block_size(qtype)
        n, k = 48, 2 * max(bs, 256)
        blocks = random_blocks(kern, qtype, n, k, gen)
        x = torch.randn(11, k, generator=gen)
        weight = kern.rows(qtype, blocks, k, torch.arange(n))
        side = kern.x16(qtype, blocks, k)
        if side is None:
            return False
        for run in (lambda rows: kern.linear(qtype, blocks, k, rows, None),
                    lambda rows: kern.linear_x16(qtype, side, n, k, rows, None)):
            out = run(x)
            if not within_quantized_bound(out, x, weight, bs):
                return False
            alone = torch.cat([run(x[i : i + 1].contiguous()) for i in range(len(x))])
            if not (torch.equal(alone, out) and torch.equal(run(x[3:9].contiguous()), out[3:9])):
                return False
    return True


def quantize_activations(x: torch.Tensor, bs: int) -> torch.Tensor:
    """The activations as the kernel sees them (each block of `bs` values int8 times its scale), in float64."""
    rows, k = x.shape
    xb = x.float().reshape(rows, k // bs, bs)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv).clamp(-127, 127)
    return (q.double() * (amax / 127.0).double()).reshape(rows, k)


def within_quantized_bound(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bs: int) -> bool:
    """Whether `out` is (quantized x) @ weight.T up to an fp32 sum's rounding: the kernel's arithmetic, checked from
    outside (integer sums are exact; each block's float term and the pairwise total round a few times)."""
    xq = quantize_activations(x, bs)
    w64 = weight.double()
    exact = xq @ w64.T
    size = xq.abs() @ w64.abs().T
    return bool(((out.double() - exact).abs() <= 1e-5 * size + 1e-30).all())


def required_kernel() -> BlockKernel:
    """This CPU's kernel, or a PairError saying why the gguf precision cannot run here."""
    from specviz.models.base import PairError

    kern = kernel()
    if kern is None:
        raise PairError("the gguf precision needs blockgemm, which could not be built or failed its checks here "
                        "(no C compiler, or SPECVIZ_BLOCKGEMM=0): choose fp16w or fp32")
    return kern


def may_build() -> bool:
    """Whether this process has yet to build or load its kernel and could (not switched off, a C compiler present):
    a first start, where compiling is worth overlapping with other work."""
    return (kernel.cache_info().currsize == 0 and os.environ.get(_ENV_OFF, "1").strip() != "0"
            and rowgemm._compiler() is not None)


@functools.lru_cache(maxsize=4)
def kernel(isa: str = "native") -> BlockKernel | None:
    """The kernel of this path built for this machine, loaded and checked once per process; None where it cannot be
    had here (no compiler, a failed build or check, SPECVIZ_BLOCKGEMM=0)."""
    return rowgemm.built_and_checked(_ENV_OFF, lambda: build(isa), load, checks_pass)


class BlockLinear(nn.Module):
    """An nn.Linear whose weight is a GGUF tensor's quantized blocks (N, row bytes), read in place; input, bias and
    output fp32. `rows(ids)` gives some rows of the weight as fp32 (a head's share of an output layer)."""

    dtype = torch.float32

    def __init__(self, blocks: torch.Tensor, qtype: int, in_features: int, bias: torch.Tensor | None,
                 kernel: BlockKernel) -> None:
        super().__init__()
        self.out_features, self.in_features = int(blocks.shape[0]), int(in_features)
        self.qtype, self.kernel = int(qtype), kernel
        self.blocks = blocks  # (N, row bytes) uint8: the file's own bytes (a mapped view, or a copy where permuted)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        # Q4_K and Q6_K: repacked once, 16 rows side by side (blockgemm_x16.h), what every pass then reads; the
        # file's blocks stay mapped for `rows` (untouched by passes, so they leave memory)
        self.x16 = kernel.x16(self.qtype, blocks, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if self.x16 is not None:
            y = self.kernel.linear_x16(self.qtype, self.x16, self.out_features, self.in_features, rows, self.bias)
        else:
            y = self.kernel.linear(self.qtype, self.blocks, self.in_features, rows, self.bias)  # (M, N)
        return y.reshape(*x.shape[:-1], self.out_features)

    def forget_blocks(self) -> None:
        """Let the blocks go where the side-by-side form holds every bit and no row will be read (a requantized draft's
        own copy: it would double the draft's memory); `rows` and `subset` then refuse."""
        if self.x16 is not None:
            self.blocks = None

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is None:
            raise ValueError("this layer kept only its side-by-side form: its rows cannot be read")
        return self.kernel.rows(self.qtype, self.blocks, self.in_features, ids)

    def subset(self, ids: torch.Tensor) -> "BlockLinear":
        """A layer of only the rows `ids` (ascending), their blocks copied as stored (a head's share of an output layer)."""
        if self.blocks is None:
            raise ValueError("this layer kept only its side-by-side form: its rows cannot be read")
        bias = None if self.bias is None else self.bias[ids]
        return BlockLinear(self.blocks[ids].contiguous(), self.qtype, self.in_features, bias, self.kernel)

    def nbytes(self) -> int:
        held = self.blocks.numel() if self.x16 is None else self.x16.numel()
        return held + (0 if self.bias is None else 4 * self.out_features)

    def extra_repr(self) -> str:
        form = "16 rows side by side" if self.x16 is not None else "as stored"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{TYPE_NAMES.get(self.qtype, self.qtype)} blocks, {form} (blockgemm {self.kernel.isa})")


class BlockEmbedding(nn.Module):
    """An nn.Embedding held as a GGUF tensor's quantized blocks: each looked-up row is dequantized when asked for."""

    def __init__(self, blocks: torch.Tensor, qtype: int, dim: int, kernel: BlockKernel) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(blocks.shape[0]), int(dim)
        self.qtype, self.kernel, self.blocks = int(qtype), kernel, blocks
        self.padding_idx = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids).reshape(*ids.shape, self.embedding_dim)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.kernel.rows(self.qtype, self.blocks, self.embedding_dim, ids)

    @property
    def weight(self) -> torch.Tensor:
        """The whole matrix in fp32 (for the rare reader of all of it: 0.9 GB for the Qwen 1.5B's)."""
        return self.rows(torch.arange(self.num_embeddings))

    def nbytes(self) -> int:
        return self.blocks.numel()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {TYPE_NAMES.get(self.qtype, self.qtype)} blocks"


class FusedBlocks:
    """Linears that share an input (a layer's q, k, v; its gate and up) of one type and width, their side-by-side
    matrices one tensor (each layer's a view of its rows): one kernel call computes them all, each output its own
    lane from start to end, so every layer gets the bits its own call gives (only the number of calls changes)."""

    def __init__(self, layers: list[BlockLinear]) -> None:
        self.layers = tuple(layers)
        self.kernel, self.qtype, self.in_features = layers[0].kernel, layers[0].qtype, layers[0].in_features
        self.widths = [m.out_features for m in layers]
        self.x16 = torch.cat([m.x16 for m in layers])  # groups of 16 rows are contiguous: rows after rows
        biases = [m.bias for m in layers]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(w) for b, w in zip(biases, self.widths)])
        start = 0
        for m in layers:  # each layer now reads its slice of the one tensor: no second copy
            size = m.x16.numel()
            m.x16 = self.x16[start : start + size]
            m.fused_with = self
            start += size

    def __call__(self, x: torch.Tensor, layers: tuple[nn.Module, ...]) -> list[torch.Tensor]:
        return rowgemm.split_columns(self.joined(x), x.shape[:-1], self.widths, self.widths)

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """The one call's output (M, sum of widths), the layers' columns side by side."""
        rows = x.reshape(-1, self.in_features).float().contiguous()
        return self.kernel.linear_x16(self.qtype, self.x16, sum(self.widths), self.in_features, rows, self.bias)


def fuse(model: nn.Module) -> int:
    """Give each decoder layer's q/k/v and gate/up one side-by-side tensor where they are block linears of one type
    and width (core.lean calls them once); returns how many groups were fused."""
    from specviz.models.rowgemm import _groups

    n = 0
    for group in _groups(model):
        if all(isinstance(m, BlockLinear) and m.x16 is not None for m in group) and \
                len({(m.qtype, m.in_features) for m in group}) == 1:
            FusedBlocks(list(group))
            n += 1
    return n


def block_bytes(model: nn.Module) -> int:
    """Bytes of a model's quantized blocks (each tensor once, an output layer tied to the embedding too)."""
    seen: set[int] = set()
    total = 0
    for m in model.modules():
        if not isinstance(m, (BlockLinear, BlockEmbedding)):
            continue
        held = m.blocks if m.blocks is not None else m.x16  # a requantized draft's layer keeps its side-by-side form only
        if held.data_ptr() not in seen:
            seen.add(held.data_ptr())
            total += m.nbytes()
    return total


def blocks_from_numpy(data: np.ndarray) -> torch.Tensor:
    """A GGUF reader's (N, row bytes) uint8 array as a tensor over the same memory (the file's mapping)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only mapping: nothing here ever writes to it
        return torch.from_numpy(data)
