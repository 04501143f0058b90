"""blockgemm, the kernel on a GGUF's own blocks: gguf's values, each row the same bits in any mix, the same bits on every path."""

import numpy as np
import pytest
import torch

from specviz.models import blocks

KERNEL = blocks.kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="blockgemm cannot be built here (no C compiler)")


def _cpu_has(*flags: str) -> bool:
    try:
        found = open("/proc/cpuinfo").read().split()
    except OSError:
        return False
    return all(f in found for f in flags)


# every path the source has, each built with its own flags: this CPU's own (AVX-512 with VNNI where it has them), the
# x86-64-v3 level (AVX2: the AVX2-only EPYCs'), and plain C (any other CPU); each is built and run wherever the suite runs
_AVX512 = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")
_RUNS = {"native": True, "avx2": _cpu_has("avx2", "fma", "f16c"), "avx512": _cpu_has(*_AVX512), "portable": True}
ISAS = [pytest.param(isa, marks=pytest.mark.skipif(not runs, reason=f"this CPU cannot run the {isa} path"))
        for isa, runs in _RUNS.items()]
TYPES = list(blocks.TYPES)
X16_TYPES = [name for name in TYPES if name != "Q5_K"]  # the types repacked 16 rows side by side


@pytest.fixture(scope="module")
def kernels():
    built = {}
    for isa, runs in _RUNS.items():
        if not runs:
            continue
        path = blocks.build(isa)
        assert path is not None, f"the {isa} path did not build"
        built[isa] = blocks.load(path)
    return built


def _case(kern, name: str, n: int, gen: torch.Generator):
    qtype = blocks.TYPES[name]
    bs = kern.block_size(qtype)
    k = bs * 5 if bs == 256 else 32 * 29  # 5 super-blocks (not a multiple of the 8 lanes' groups), or 29 blocks
    return qtype, bs, k, blocks.random_blocks(kern, qtype, n, k, gen)


@pytest.mark.parametrize("name", TYPES)
def test_rows_are_ggufs_own_dequantization_bit_for_bit(kernels, name):
    import gguf

    kern = kernels["native"]
    qtype, bs, k, data = _case(kern, name, 23, torch.Generator().manual_seed(3))
    ref = gguf.quants.dequantize(data.numpy(), gguf.GGMLQuantizationType(qtype)).reshape(23, k)
    ids = torch.tensor([5, 0, 22, 5])
    assert torch.equal(kern.rows(qtype, data, k, ids), torch.from_numpy(ref)[ids])
    with pytest.raises(IndexError):
        kern.rows(qtype, data, k, torch.tensor([23]))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_each_path_is_the_quantized_product_and_gives_a_row_the_same_bits_in_any_mix(kernels, isa, name):
    if isa not in kernels:
        pytest.skip("no such path on this CPU")
    kern = kernels[isa]
    if isa == "portable":
        assert kern.isa == "portable"
    gen = torch.Generator().manual_seed(1)
    qtype, bs, k, data = _case(kern, name, 45, gen)
    weight = kern.rows(qtype, data, k, torch.arange(45))
    bias = torch.randn(45, generator=gen)
    x = torch.randn(40, k, generator=gen)
    out = kern.linear(qtype, data, k, x, bias)
    assert blocks.within_quantized_bound(out - bias, x, weight, bs)
    slip = out.clone()
    slip[7, 10] += 0.01 * float(out[7].abs().mean())  # one output off by 1 % of its row's size: the bound sees it
    assert not blocks.within_quantized_bound(slip - bias, x, weight, bs)
    alone = torch.cat([kern.linear(qtype, data, k, x[i : i + 1].contiguous(), bias) for i in range(len(x))])
    assert torch.equal(out, alone)
    for trial in range(12):  # random mixes: any subset of rows, in any order, any count
        rows = torch.randperm(len(x), generator=gen)[: int(torch.randint(1, len(x) + 1, (1,), generator=gen))]
        assert torch.equal(kern.linear(qtype, data, k, x[rows].contiguous(), bias), out[rows])


@pytest.mark.parametrize("name", TYPES)
def test_every_path_gives_the_same_bits(kernels, name):
    """Integer block sums in fixed lanes, then one float order: the vector paths are the plain C, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    qtype, bs, k, data = _case(kernels["portable"], name, 37, gen)
    x = torch.randn(9, k, generator=gen)
    outs = {isa: kern.linear(qtype, data, k, x, None) for isa, kern in kernels.items()}
    assert all(torch.equal(outs["portable"], out) for out in outs.values()), {i: k.isa for i, k in kernels.items()}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", X16_TYPES)
def test_the_side_by_side_form_is_the_quantized_product_alone_or_in_any_mix_on_every_path(kernels, isa, name):
    """The form passes read (16 rows side by side, blockgemm_x16.h): the same checks, and the same bits on every path."""
    gen = torch.Generator().manual_seed(4)
    qtype, bs, k, data = _case(kernels[isa], name, 48, gen)
    weight = kernels[isa].rows(qtype, data, k, torch.arange(48))
    x, bias = torch.randn(30, k, generator=gen), torch.randn(48, generator=gen)
    outs = {}
    for path, kern in kernels.items():
        packed = kern.x16(qtype, data, k)
        assert packed is not None and packed.numel() < 1.15 * data.numel()  # every bit kept, about the file's size
        outs[path] = kern.linear_x16(qtype, packed, 48, k, x, bias)
    out = outs[isa]
    assert blocks.within_quantized_bound(out - bias, x, weight, bs)
    assert all(torch.equal(out, other) for other in outs.values())
    packed = kernels[isa].x16(qtype, data, k)
    for size in (1, 2, 5, 16, 30):
        rows = torch.randperm(30, generator=gen)[:size]
        assert torch.equal(kernels[isa].linear_x16(qtype, packed, 48, k, x[rows].contiguous(), bias), out[rows])


@pytest.mark.parametrize("name", TYPES)
def test_requantized_q4_0_is_ggufs_own_quantization_bit_for_bit_on_every_path(kernels, name):
    """A draft's wider linears read at 4.5 bits: gguf's Q4_0 quantization of gguf's own floats of the blocks, each byte
    the same (ties of magnitude, all-zero blocks and fp16 rounding included), whatever the path."""
    import gguf

    qtype, bs, k, data = _case(kernels["native"], name, 19, torch.Generator().manual_seed(5))
    data[3, :] = data[2, :]  # rows that repeat; a row of zero scales: every value 0, d = -0
    for at in blocks._SCALE_AT[qtype]:
        data.view(19, -1, kernels["native"].block_bytes(qtype))[4, :, at : at + 2] = 0
    floats = gguf.quants.dequantize(data.numpy(), gguf.GGMLQuantizationType(qtype)).reshape(19, k)
    ref = gguf.quants.quantize(floats.astype(np.float32), gguf.GGMLQuantizationType.Q4_0).reshape(19, -1)
    for isa, kern in kernels.items():
        out = kern.requantize_q4_0(qtype, data, k)
        assert out.shape == (19, k // 32 * 18)
        assert np.array_equal(out.numpy(), ref), isa
    with pytest.raises(ValueError, match="cannot requantize"):
        kernels["native"].requantize_q4_0(qtype, data[:, :-1].contiguous(), k)  # rows of part of a block


@pytest.mark.parametrize("isa", ISAS)
def test_attention_is_sdpa_and_gives_each_row_its_own_steps_bits_on_every_path(kernels, isa):
    """The gguf models' attention (blockgemm_attend.h): softmax(q k / sqrt d) v to float error, grouped key heads;
    a row inside 5 (causal) or a tree's rows (a mask) gets exactly the bits of its own one-token step; every path alike."""
    kern = kernels[isa]
    gen = torch.Generator().manual_seed(6)
    heads, groups, d, kv, n = 6, 2, 64, 23, 5
    q = torch.randn(1, heads, n, d, generator=gen)
    k, v = torch.randn(1, groups, kv, d, generator=gen), torch.randn(1, groups, kv, d, generator=gen)
    out = kern.attend(q, k, v, None, d ** -0.5)
    rep = heads // groups
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1),
        attn_mask=torch.ones(n, kv, dtype=torch.bool).tril(kv - n))
    assert torch.allclose(out.double(), ref.transpose(1, 2), atol=1e-5)
    for r in range(n):  # row r alone: the keys up to its position, as its own step holds them
        alone = kern.attend(q[:, :, r : r + 1], k[:, :, : kv - n + r + 1], v[:, :, : kv - n + r + 1], None, d ** -0.5)
        assert torch.equal(alone[:, 0], out[:, r])
    seen = torch.zeros(n, kv, dtype=torch.bool)  # a tree: the prefix, then each row its own ancestors
    seen[:, : kv - n] = True
    for r, path in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4]]):
        seen[r, [kv - n + p for p in path]] = True
    tree = kern.attend(q, k, v, seen, d ** -0.5)
    for r in range(n):
        keep = seen[r].nonzero().reshape(-1)
        alone = kern.attend(q[:, :, r : r + 1], k[:, :, keep], v[:, :, keep], None, d ** -0.5)
        assert torch.equal(alone[:, 0], tree[:, r])
    assert all(torch.equal(out, other.attend(q, k, v, None, d ** -0.5)) for other in kernels.values())
    with pytest.raises(ValueError, match="cannot attend"):
        kern.attend(q[..., :40], k[..., :40], v[..., :40], None, 0.1)  # a width not a multiple of 16


@pytest.mark.parametrize("isa", ISAS)
def test_the_layers_glue_is_transformers_expression_and_each_row_its_own_on_every_path(kernels, isa):
    """RMSNorm, rotary and the SiLU gate of the gguf models (blockgemm_glue.h): transformers' values to float error, a
    row's bits the same alone and among 7 others, every path alike."""
    kern = kernels[isa]
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(8, 96, generator=gen), torch.rand(96, generator=gen) + 0.5
    normed = kern.rms_norm(x, w, 1e-6)
    assert torch.allclose(normed, w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(kern.rms_norm(x[r : r + 1], w, 1e-6), normed[r : r + 1]) for r in range(8))
    q = torch.randn(1, 8, 3, 64, generator=gen)
    angle = torch.rand(1, 8, 32, generator=gen) * 6
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    half = torch.cat([-q[..., 32:], q[..., :32]], -1)
    turned = kern.rotary_(q.clone(), cos, sin)
    assert torch.allclose(turned, q * cos.unsqueeze(2) + half * sin.unsqueeze(2), atol=1e-6)
    assert all(torch.equal(kern.rotary_(q[:, r : r + 1].clone(), cos[:, r : r + 1], sin[:, r : r + 1]), turned[:, r : r + 1])
               for r in range(8))
    joined = torch.randn(8, 2 * 40, generator=gen)
    gated = kern.silu_mul(joined, 40)
    assert torch.allclose(gated, torch.nn.functional.silu(joined[:, :40]) * joined[:, 40:], rtol=1e-5, atol=1e-6)
    assert all(torch.equal(kern.silu_mul(joined[r : r + 1], 40), gated[r : r + 1]) for r in range(8))
    for other in kernels.values():
        assert torch.equal(other.rms_norm(x, w, 1e-6), normed) and torch.equal(other.silu_mul(joined, 40), gated)
        assert torch.equal(other.rotary_(q.clone(), cos, sin), turned)
    with pytest.raises(ValueError):
        kern.rms_norm(torch.randn(2, 40), torch.ones(40), 1e-6)  # a width not a multiple of 16


def test_a_shape_it_cannot_run_is_refused_not_guessed():
    qtype = blocks.TYPES["Q4_K"]
    data = blocks.random_blocks(KERNEL, qtype, 4, 512, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="cannot run"):
        KERNEL.linear(qtype, data, 500, torch.randn(2, 500), None)  # K not a multiple of the 256-block


@pytest.mark.real
@pytest.mark.parametrize("which", ["target", "draft"])
def test_real_tensors_of_the_default_pair_files(which):
    """Every type in the default pair's two files, on real rows: gguf's values, the quantized product, any row mix."""
    import gguf

    from specviz.models.catalogue import QWEN_05B, QWEN_15B
    from specviz.models.locate import _verified_gguf

    src = QWEN_15B if which == "target" else QWEN_05B
    with _verified_gguf(src, lambda f, m: None) as path:
        reader = gguf.GGUFReader(str(path))
        seen = {}
        for t in reader.tensors:  # the first weight of each quantized type (a layer's, or the output layer's)
            if t.tensor_type.name in blocks.TYPES and t.tensor_type.name not in seen and t.name != "token_embd.weight":
                seen[t.tensor_type.name] = t
        assert seen, "no quantized tensor found"
        gen = torch.Generator().manual_seed(0)
        for name, t in seen.items():
            rows = np.array(t.data[:300])  # (300, bytes a row): 300 output rows of the real matrix
            data = torch.from_numpy(rows)
            k = int(t.shape[0])
            ref = torch.from_numpy(gguf.quants.dequantize(rows, t.tensor_type).reshape(300, k))
            assert torch.equal(KERNEL.rows(int(t.tensor_type), data, k, torch.arange(300)), ref), name
            x = torch.randn(16, k, generator=gen)
            out = KERNEL.linear(int(t.tensor_type), data, k, x, None)
            assert blocks.within_quantized_bound(out, x, ref, KERNEL.block_size(int(t.tensor_type))), name
            for size in (1, 5, 16):
                assert torch.equal(KERNEL.linear(int(t.tensor_type), data, k, x[:size].contiguous(), None), out[:size]), name
            q4 = gguf.quants.quantize(ref.numpy(), gguf.GGMLQuantizationType.Q4_0).reshape(300, -1)
            assert np.array_equal(KERNEL.requantize_q4_0(int(t.tensor_type), data, k).numpy(), q4), name  # a draft's
            packed = KERNEL.x16(int(t.tensor_type), data, k)  # the form passes read, where the type has it
            if packed is not None:
                side = KERNEL.linear_x16(int(t.tensor_type), packed, 300, k, x, None)
                assert blocks.within_quantized_bound(side, x, ref, KERNEL.block_size(int(t.tensor_type))), name
                for size in (1, 5, 16):
                    assert torch.equal(KERNEL.linear_x16(int(t.tensor_type), packed, 300, k, x[:size].contiguous(), None),
                                       side[:size]), name
