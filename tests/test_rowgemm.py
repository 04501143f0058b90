"""rowgemm, the kernel of our own: right values, each row the same bits whatever shares its call, every code path it has."""

import pytest
import torch

from specviz.models import half, rowgemm

KERNEL = rowgemm.kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="rowgemm cannot be built here (no C compiler): fbgemm is used")


def _cpu_has(flag: str) -> bool:
    try:
        return flag in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


def _built(isa: str, tmp_path) -> rowgemm.Kernel:
    path = rowgemm.build(tmp_path, isa)
    assert path is not None
    return rowgemm.load(path)


# every code path the source has, each built with its own flags: avx512 (this CPU's, where it has it), avx2 (the x86-64-v3
# level: the AVX2 EPYCs'), portable (plain C: any other CPU)
ISAS = [pytest.param("native", id="native"),
        pytest.param("avx2", id="avx2", marks=pytest.mark.skipif(not _cpu_has("avx2") or not _cpu_has("f16c"), reason="no AVX2")),
        pytest.param("portable", id="portable")]


def _weights(kind: str, n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(stored weight for pack, its exact fp64 values, int8 scale or None)."""
    if kind == "fp16":
        w = (torch.randn(n, k, generator=gen) * 0.05).half()
        return w, w.double(), None
    q, scale = rowgemm.quantize_rows(torch.randn(n, k, generator=gen))
    return q, q.double() * scale.double()[:, None], scale


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["fp16", "int8"])
def test_each_build_matches_fp64_and_gives_a_row_the_same_bits_in_any_mix(isa, kind, tmp_path):
    kern = _built(isa, tmp_path)
    if isa == "portable":
        assert kern.isa == "portable"
    gen = torch.Generator().manual_seed(1)
    n, k = 333, 700  # a partial last panel, and k over two chunks and a bit
    stored, exact, scale = _weights(kind, n, k, gen)
    panels = rowgemm.pack(stored, kern.cols)
    bias = torch.randn(n, generator=gen)
    x = torch.randn(60, k, generator=gen)
    out = kern.linear(x, panels, n, bias, scale)
    assert rowgemm.within_sum_bound(out, x, exact, bias)
    slip = out.clone()
    slip[7, 100] += 0.01 * float(out[7].abs().mean())  # one output off by 1 % of its row's size
    assert not rowgemm.within_sum_bound(slip, x, exact, bias)
    alone = torch.cat([kern.linear(x[i : i + 1], panels, n, bias, scale) for i in range(len(x))])
    assert torch.equal(out, alone)
    for trial in range(30):  # random mixes: any subset of rows, in any order, any count (1 .. 60)
        m = int(torch.randint(1, 61, (1,), generator=gen))
        pick = torch.randperm(60, generator=gen)[:m]
        assert torch.equal(kern.linear(x[pick].contiguous(), panels, n, bias, scale), alone[pick]), (trial, m)


def test_pack_and_unpack_are_inverse_and_pad_the_last_panel_with_zeros():
    w = torch.randn(130, 17).half()
    panels = rowgemm.pack(w, 64)
    assert panels.shape == (3, 17, 64) and panels.dtype == torch.float16
    assert torch.equal(rowgemm.unpack(panels, 130), w)
    assert not panels[2, :, 2:].any()  # columns 130..191 do not exist: zeros, never written out


def test_quantize_rows_keeps_each_row_within_half_a_step():
    w = torch.randn(50, 40) * torch.logspace(-3, 2, 50)[:, None]
    q, scale = rowgemm.quantize_rows(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert bool(((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all())


def test_without_a_compiler_there_is_no_kernel_and_fp16w_runs_on_fbgemm(monkeypatch, tmp_path):
    monkeypatch.setattr(rowgemm, "_compiler", lambda: None)
    assert rowgemm.build(tmp_path) is None
    kernel, choice = rowgemm.kernel, half.fp16_kernel
    try:
        rowgemm.kernel.cache_clear(), half.fp16_kernel.cache_clear()
        monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))  # no kernel built here yet
        assert rowgemm.kernel() is None and half.fp16_kernel() is None
        if half.fbgemm_works():
            assert half.kernel_name() == "fbgemm" and half.half_works()
            layer = half.HalfLinear(torch.randn(20, 30), None)
            assert layer.panels is None and layer.pieces and layer(torch.randn(3, 30)).shape == (3, 20)
    finally:
        rowgemm.kernel.cache_clear(), half.fp16_kernel.cache_clear()
    assert kernel() is not None and choice() is not None or half.kernel_name().startswith("fbgemm")


def test_a_kernel_that_gives_wrong_values_is_refused(tmp_path):
    """checks_pass runs before any model uses a kernel: one that computes something else is not used."""
    kern = _built("native", tmp_path)

    class Wrong:
        cols, isa = kern.cols, kern.isa

        def linear(self, x, panels, n, bias, scale=None):
            y = kern.linear(x, panels, n, bias, scale)
            return y + (len(x) > 1) * 1e-3  # right alone, wrong among others

    assert rowgemm.checks_pass(kern) and not rowgemm.checks_pass(Wrong())


@pytest.mark.real
def test_the_fp16w_targets_own_layers_give_a_row_the_same_bits_in_any_mix(qwen_fp16w_pair):
    """Every distinct linear shape of the default pair's fp16w target (the lm_head's 151,936 columns included), its real weights,
    random rows mixed at random: each row's output equals the same row alone, bit for bit; and the batched executor's
    load-time check (whole packed passes of several runs against each alone) finds the same."""
    from specviz.serve.exact import batch_exactness

    target = qwen_fp16w_pair.target
    layers = {(m.in_features, m.out_features): m for m in target.modules()
              if isinstance(m, half.HalfLinear) and m.panels is not None}
    if not layers:
        pytest.skip("the default target runs on fbgemm here (rowgemm measured slower, or not built)")
    assert len(layers) >= 5 and any(out == target.config.vocab_size for _, out in layers)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for (n_in, n_out), layer in layers.items():
            x = torch.randn(24, n_in, generator=gen)
            alone = torch.cat([layer(x[i : i + 1]) for i in range(24)])
            for _ in range(6):
                m = int(torch.randint(2, 25, (1,), generator=gen))
                pick = torch.randperm(24, generator=gen)[:m]
                assert torch.equal(layer(x[pick]), alone[pick]), (n_in, n_out, m)
    assert batch_exactness(target).exact
