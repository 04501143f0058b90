"""fp16 weights with fp32 arithmetic on a CPU: half the target's memory and a faster step, with each row the same bits at any pass size.

Why: a step of a 1.5B target on a CPU is bound by reading its weights, so storing them in half
precision halves both its memory and most of its time. The weights stay fp16 and are widened to fp32
inside the kernel: the activations, the sums and everything outside the linears stay fp32. Unlike bf16
or dynamic int8 arithmetic, each row is then computed independently of the others. Two kernels do it:

- rowgemm (models.rowgemm, our own, built here at first use): reads the weights once for all rows of a
  pass, on every core, and computes each output as one FMA chain in k order, so a row's bits never depend
  on the pass size, by construction;
- fbgemm (torch's `quantized.linear_dynamic_fp16`), which builds some row counts with other kernels (on
  the CPUs measured here 1, 2, 7, 14, 31, 32, ... rows give other last bits): each call is padded with zero
  rows to the next row count measured to agree (`padded_rows`).

`fp16_kernel` picks one per process by timing both on this machine (rowgemm unless fbgemm is clearly
faster; fbgemm where rowgemm cannot be built). Either way a one-token step and a verify pass give a token
the same logits, and the promise that greedy speculative output equals the target's own holds. Where
neither works, the precision is refused (`half_works`), never used silently.
"""

from __future__ import annotations

import bisect
import functools
import os
import time

import torch

from specviz.models import rowgemm
from specviz.models.packed import _rows_agree, layers_of, plain_linear, replace_each

_PROBE_MAX_ROWS = 512  # every pass a step, a chain, a tree or a prompt of up to 512 tokens makes is padded to agree
_FP16_MAX = 65504.0  # the largest finite fp16; fbgemm's packing saturates larger weights to it
_PIECE = 32 << 20  # weights packed in row blocks of at most this many values: what fbgemm allocates while packing stays small


def _piece_rows(in_features: int) -> int:
    """Rows in one block of a weight with this many columns: at most _PIECE values (one packed piece, one temporary)."""
    return max(1, _PIECE // max(1, in_features))


def _prepack(weight: torch.Tensor) -> object:
    return torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), None)


def _run(x: torch.Tensor, packed: object) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x, packed)


@functools.lru_cache(maxsize=1)
def agreeing_rows() -> tuple[int, ...]:
    """Row counts (1.._PROBE_MAX_ROWS) that give every row the bits it gets in passes of 4 rows (empty: kernel missing or wrong)."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=gen)
    x = torch.randn(_PROBE_MAX_ROWS, 64, generator=gen)
    try:
        with torch.no_grad():
            packed = _prepack(weight)
            # the reference: passes of 4 rows (a chain's verify pass). Where 4 were built by odd kernels on some
            # CPU, few counts agree with it and the precision is refused: a wrong claim is worse than none
            reference = torch.cat([_run(x[i : i + 4], packed) for i in range(0, _PROBE_MAX_ROWS, 4)])
            if not torch.allclose(reference, x @ weight.half().float().T, rtol=1e-4, atol=1e-4):
                return ()
            # a count agrees where the first and the last m rows both do
            return tuple(m for m in range(1, _PROBE_MAX_ROWS + 1)
                         if all(torch.equal(_run(x[s : s + m], packed), reference[s : s + m]) for s in (0, _PROBE_MAX_ROWS - m)))
    except (RuntimeError, NotImplementedError, AttributeError):  # torch without fbgemm (not x86) or no fp16 kernel
        return ()


def fbgemm_works() -> bool:
    """Whether fbgemm's fp16-weight linears run here and some small row counts agree (so padding keeps rows invariant)."""
    good = agreeing_rows()
    return bool(good) and good[0] <= 8


def half_works() -> bool:
    """Whether fp16-weight linears run here with each row's bits independent of the pass: rowgemm, or padded fbgemm."""
    return fp16_kernel() is not None or fbgemm_works()


_KERNEL_ENV = "SPECVIZ_FP16_KERNEL"  # auto (measure), rowgemm or fbgemm: the operator's override, e.g. to compare
_CLEAR_WIN = 0.8  # fbgemm must be this much faster than rowgemm to be kept: rowgemm is invariant by construction
_PROBE_SHAPE = (1536, 8960)  # (in, out): the 1.5B target's MLP up-projection
_PROBE_COPIES = 3  # distinct matrices timed in turn: 82 MB of fp16, more than a CPU's last-level cache holds


@functools.lru_cache(maxsize=1)
def fp16_kernel() -> rowgemm.Kernel | None:
    """The rowgemm kernel where it is built, checked and not clearly slower than fbgemm here; None: fbgemm.

    Timed on matrices of the target's MLP shape, more of them than a cache holds (a step streams its weights
    from memory), over 1 and 5 rows (a step and a chain's verify pass), turn about so a busy CPU slows both alike.
    """
    choice = os.environ.get(_KERNEL_ENV, "auto").strip().lower()
    kern = None if choice == "fbgemm" else rowgemm.kernel()
    if kern is None or choice == "rowgemm" or not fbgemm_works():
        return kern
    fbgemm_ms, rowgemm_ms = kernel_timings(kern)
    return kern if fbgemm_ms >= _CLEAR_WIN * rowgemm_ms else None


@functools.lru_cache(maxsize=1)
def kernel_timings(kern: rowgemm.Kernel) -> tuple[float, float]:
    """(fbgemm, rowgemm) ms of one row plus five rows through _PROBE_COPIES matrices of _PROBE_SHAPE, best of 5."""
    gen = torch.Generator().manual_seed(0)
    n_in, n_out = _PROBE_SHAPE
    with torch.no_grad():
        weights = [torch.randn(n_out, n_in, generator=gen).mul_(0.02).half() for _ in range(_PROBE_COPIES)]
        fb = [[_prepack(w[i : i + _piece_rows(n_in)]) for i in range(0, n_out, _piece_rows(n_in))] for w in weights]
        rg = [rowgemm.pack(w, kern.cols) for w in weights]
        del weights
        xs = [torch.randn(m, n_in, generator=gen) for m in (1, 5)]

        def run_fbgemm() -> None:
            for x in xs:
                for pieces in fb:
                    for p in pieces:
                        _run(torch.cat([x, x.new_zeros(padded_rows(len(x)) - len(x), n_in)]), p)

        def run_rowgemm() -> None:
            for x in xs:
                for panels in rg:
                    kern.linear(x, panels, n_out, None)

        best = [float("inf"), float("inf")]
        run_fbgemm(), run_rowgemm()
        for _ in range(5):
            for i, fn in enumerate((run_fbgemm, run_rowgemm)):
                t = time.perf_counter()
                fn()
                best[i] = min(best[i], (time.perf_counter() - t) * 1000.0)
    return best[0], best[1]


def kernel_name() -> str:
    """Which kernel the fp16-weight linears of this process use, for the page and --json: "rowgemm (avx512)" or "fbgemm"."""
    kern = fp16_kernel()
    return f"rowgemm ({kern.isa})" if kern is not None else "fbgemm" if fbgemm_works() else "none"


def padded_rows(n: int) -> int:
    """The smallest agreeing row count >= n (n itself beyond the probed range: a long prompt's prefill)."""
    good = agreeing_rows()
    i = bisect.bisect_left(good, n)
    return good[i] if i < len(good) else n


class HalfLinear(torch.nn.Module):
    """An nn.Linear whose weight is held in fp16 (rowgemm's panels, or fbgemm's packed blocks with rows padded to
    agree); input, bias and output stay fp32."""

    dtype = torch.float32  # of its inputs and outputs (what a caller feeds it)

    def __init__(self, weight: torch.Tensor | None, bias: torch.nn.Parameter | None, in_features: int = 0,
                 out_features: int = 0, kernel: rowgemm.Kernel | None | str = "chosen") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape if weight is not None else (out_features, in_features)
        self.bias = bias  # the model's own parameter: filled by a streaming load, shared with nothing else
        # the process's choice unless a test or a comparison names one (None: fbgemm)
        self.kernel = fp16_kernel() if kernel == "chosen" else kernel
        self.pieces: list[object] = []  # fbgemm's packed row blocks
        self.panels: torch.Tensor | None = None  # rowgemm's (ceil(out/64), in, 64) fp16 panels
        if weight is not None:
            self.load(weight)

    def load(self, weight: torch.Tensor) -> None:
        """Pack a weight (any float dtype), row block by row block."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight {tuple(weight.shape)} does not fit a {self.in_features}->{self.out_features} layer")
        if self.kernel is not None:
            w16 = fp16_values(weight) if weight.dtype != torch.float16 else weight
            if self.panels is None:
                self.panels = rowgemm.pack(w16, self.kernel.cols)
            else:  # laid out before loading (rowgemm.preallocate): filled in place
                rowgemm.pack_into(self.panels, w16)
            return
        step = _piece_rows(self.in_features)
        self.pieces = [_prepack(weight[i : i + step]) for i in range(0, self.out_features, step)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        if self.panels is not None:  # one call, every core, no padding: each row's chain is its own
            y = self.kernel.linear(rows.contiguous(), self.panels, self.out_features,
                                   None if self.bias is None else self.bias.detach())
            return y.reshape(*x.shape[:-1], self.out_features)
        n = rows.shape[0]
        m = padded_rows(n)
        if m > n:  # zero rows: only so that fbgemm builds these rows with the same kernels as any other pass
            rows = torch.cat([rows, rows.new_zeros(m - n, self.in_features)])
        outs = [_run(rows, p) for p in self.pieces]
        y = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))[:n]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def unpacked_weight(self) -> torch.Tensor:
        """The weight in fp32 (a new tensor, fp16-exact values): for copies such as the int8 twin."""
        if self.panels is not None:
            return rowgemm.unpack(self.panels, self.out_features).float()
        return torch.cat([torch.ops.quantized.linear_unpack_fp16(p)[0] for p in self.pieces])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Some rows of the weight in fp32 (ascending ids), one piece unpacked at a time: no full fp32 copy."""
        if self.panels is not None:
            cols = self.panels.shape[-1]
            return self.panels[ids // cols, :, ids % cols].float()  # (len(ids), in)
        out, start = [], 0
        for p in self.pieces:
            w = torch.ops.quantized.linear_unpack_fp16(p)[0]
            inside = ids[(ids >= start) & (ids < start + w.shape[0])]
            out.append(w[inside - start].float())
            start += w.shape[0]
        return torch.cat(out)

    def to_linear(self) -> torch.nn.Linear:
        return plain_linear(self.unpacked_weight(), None if self.bias is None else self.bias.data)

    def __deepcopy__(self, memo: dict) -> "HalfLinear":
        """A copy sharing the packed pieces (read-only) and what `memo` maps; the bias is copied unless shared."""
        new = HalfLinear(None, None, self.in_features, self.out_features)
        memo[id(self)] = new
        new.kernel, new.pieces, new.panels = self.kernel, self.pieces, self.panels
        if self.bias is not None:
            shared = memo.get(id(self.bias))
            new.bias = shared if shared is not None else torch.nn.Parameter(self.bias.detach().clone(), requires_grad=False)
        return new

    def nbytes(self) -> int:
        return self.out_features * self.in_features * 2

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fp16 weights ({'rowgemm' if self.panels is not None else 'fbgemm'})")


def fp16_values(weight: torch.Tensor) -> torch.Tensor:
    """The fp16 values a HalfLinear holds for this weight: saturated at ±65504, then rounded to the nearest fp16 (ties
    to even), one row block at a time (the cache writer's form: no fp32 copy of a whole matrix, 0.9 GB for the head).

    That is what fbgemm's packing makes of a weight (tests/test_models_half.py holds the two equal bit for bit, ties,
    subnormals and saturation included), at a fifteenth of its cost: packing and unpacking each fp16w weight to read
    fbgemm's values back took 0.45 s for one 8960 x 1536 matrix on a 2-core Xeon, this 0.03 s."""
    out = torch.empty(tuple(weight.shape), dtype=torch.float16)
    step = _piece_rows(weight.shape[-1])
    for i in range(0, weight.shape[0], step):
        out[i : i + step] = weight[i : i + step].clamp(-_FP16_MAX, _FP16_MAX)  # the copy rounds to nearest, ties to even
    return out


def is_nearest_fp16(values: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether every stored fp16 value is a nearest fp16 of its fp32 weight, saturated at ±65504 as fbgemm saturates
    (compared a row block at a time: no fp32 temporaries the size of a whole head).

    The cache's check of an fp16w weight: its values are `fp16_values` of the dequantized weight (fbgemm's packing's
    own), and a load packs them, which leaves fp16 values as they are. This checks them against the dequantized
    weight itself with plain arithmetic, not fbgemm (packing every weight again was two thirds of the 1.5B's build);
    any wrong row or value is off by an fp16 step or more.
    """
    if values.shape != weight.shape or values.dtype != torch.float16:
        return False
    step = max(1, (1 << 22) // max(1, weight.shape[-1]))  # 16 MB temporaries a block
    for i in range(0, weight.shape[0], step):
        target = weight[i : i + step].clamp(-_FP16_MAX, _FP16_MAX)
        half_step = (target.abs() * 2.0**-11).clamp_(min=2.0**-25)  # half an fp16 spacing or more (2^-25: subnormals)
        if not bool(((values[i : i + step].float() - target).abs() <= half_step).all()):
            return False
    return True


def half_linears(model: torch.nn.Module) -> int:
    """Replace every nn.Linear of a CPU fp32 model by a HalfLinear, one at a time (peak: one extra matrix); returns how many."""
    with torch.no_grad():
        return replace_each(layers_of(model, torch.nn.Linear), lambda child: HalfLinear(child.weight, child.bias))


def empty_half_linears(model: torch.nn.Module) -> dict[str, HalfLinear]:
    """Swap every nn.Linear of a model (on the meta device) for an unfilled HalfLinear; {weight name: layer} to fill."""
    names = {id(mod): name for name, mod in model.named_modules()}
    sinks: dict[str, HalfLinear] = {}
    for parent, attr, child in layers_of(model, torch.nn.Linear):
        layer = HalfLinear(None, child.bias, child.in_features, child.out_features)
        setattr(parent, attr, layer)
        sinks[f"{names[id(child)]}.weight"] = layer
    return sinks


def rows_agree(model: torch.nn.Module, counts: tuple[int, ...] = (1, 2, 3, 5, 7, 9, 14, 17, 25, 33)) -> bool:
    """Whether each distinct HalfLinear shape of a model gives every row the same bits at these pass sizes (padded).

    The probe behind padded_rows used a small matrix; this checks the model's own layers once at load,
    so that a CPU whose kernels pick by shape is caught, not trusted.
    """
    gen = torch.Generator().manual_seed(0)
    # fbgemm's layers only: rowgemm computes every shape with the same code, one FMA chain per output whatever the row
    # count (its tails included: rowgemm.checks_pass tries a partial panel and a partial k chunk before any model uses it)
    layers = {(m.in_features, m.out_features): m for m in model.modules() if isinstance(m, HalfLinear) and m.panels is None}
    with torch.no_grad():
        return all(_rows_agree(layer, gen, counts) for layer in layers.values())


def half_bytes(model: torch.nn.Module) -> int:
    """Bytes of the fp16 weights (held by fbgemm: neither parameters nor buffers)."""
    return sum(m.nbytes() for m in model.modules() if isinstance(m, HalfLinear))


def describe(n: int) -> str:
    """One line for the precision note: the target's kernel, why, and (fbgemm) the row counts it pads to."""
    kern = fp16_kernel()
    if kern is not None:
        timed = ""
        if fbgemm_works() and os.environ.get(_KERNEL_ENV, "auto").strip().lower() == "auto":
            fb, rg = kernel_timings(kern)
            timed = f"; 1 + 5 rows of the MLP shape: rowgemm {rg:.2f} ms, fbgemm {fb:.2f} ms"
        return (f"target linears in fp16 weights with fp32 arithmetic ({n}; rowgemm {kern.isa}: weights read once for "
                f"all rows, each row the same bits at any pass size by construction{timed})")
    good = agreeing_rows()
    return (f"target linears in fp16 weights with fp32 arithmetic ({n}; fbgemm; passes padded to row counts that "
            f"agree here, e.g. 1 row -> {padded_rows(1)})") if good else "fp16-weight kernels unavailable here"
