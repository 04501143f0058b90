"""The draft's int8 weights with fp32 activations (models.int8w): right values, a reduced output layer, exact rule."""

import pytest
import torch

from specviz.core.draft_vocab import DraftVocab
from specviz.core.sampling import SamplingConfig, draft_q
from specviz.models import int8w, rowgemm
from specviz.models.weights import kernel_of

KERNEL = rowgemm.kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="rowgemm cannot be built here (no C compiler)")


def test_values_are_fp32_arithmetic_on_the_int8_weights():
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(90, 70, generator=gen), torch.randn(90, generator=gen)
    q, scale = rowgemm.quantize_rows(w)
    layer = int8w.Int8WLinear(q, scale, b, KERNEL)
    x = torch.randn(2, 5, 70, generator=gen)
    out = layer(x)
    assert out.shape == (2, 5, 90)
    assert rowgemm.within_sum_bound(out.reshape(10, 90), x.reshape(10, 70), q.double() * scale.double()[:, None], b)


def test_a_reduced_output_layer_scores_only_its_ids_and_q_is_zero_elsewhere():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(50, 16, generator=gen)
    q, scale = rowgemm.quantize_rows(w)
    vocab = DraftVocab(torch.tensor([2, 3, 11, 40, 49]), 50)
    full = int8w.Int8WLinear(q, scale, None, KERNEL)
    small = int8w.Int8WLinear(q, scale, None, KERNEL, vocab.ids)
    x = torch.randn(3, 16, generator=gen)
    a, b = full(x), small(x)
    assert torch.equal(b[:, vocab.ids], a[:, vocab.ids])  # the kept rows: the same bits as the whole layer's
    outside = torch.ones(50, dtype=torch.bool)
    outside[vocab.ids] = False
    assert bool(torch.isneginf(b[:, outside]).all())
    for mode in ("sample", "greedy"):
        probs = draft_q(b, SamplingConfig(mode), 50)
        assert torch.equal(probs[:, outside], torch.zeros(3, int(outside.sum())))  # q = 0: never proposed
        assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert small.nbytes() < full.nbytes() / 5


def test_a_dynamic_int8_layer_keeps_its_own_int8_values():
    """Converting fbgemm's per-channel int8 layer takes its int8 weights and scales as they are: the same weights."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    lin = torch.nn.Sequential(torch.nn.Linear(32, 24))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dyn = quantize_dynamic(lin, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    packed, _ = dyn[0]._packed_params._weight_bias()  # fbgemm's int8 values and scales, before the conversion
    assert int8w.int8w_linears(dyn, KERNEL) == 1
    layer = dyn[0]
    assert torch.equal(rowgemm.unpack(layer.panels, 24), packed.int_repr())
    assert torch.equal(layer.scale, packed.q_per_channel_scales().float())
    assert isinstance(layer, int8w.Int8WLinear) and kernel_of(dyn) == f"rowgemm {KERNEL.isa}, int8 weights"
    x = torch.randn(4, 32)
    with torch.no_grad():
        ref = torch.nn.functional.linear(x, lin[0].weight, lin[0].bias)
    assert torch.allclose(layer(x), ref, atol=0.05)  # int8 weights: close to fp32, not equal



def test_the_drafts_output_layer_keeps_every_id_unless_told(monkeypatch):
    """The whole vocabulary by default (over the head's ids the draft missed the presets' own words); `head` on request."""
    from specviz.models.registry import draft_vocab

    monkeypatch.delenv("SPECVIZ_DRAFT_VOCAB", raising=False)
    assert draft_vocab() == "full"
    for value, want in (("head", "head"), (" HEAD ", "head"), ("full", "full"), ("nonsense", "full")):
        monkeypatch.setenv("SPECVIZ_DRAFT_VOCAB", value)
        assert draft_vocab() == want


@pytest.mark.parametrize("zero_points", ["none", "some"])
def test_a_caches_int8_parts_become_the_layer_the_dynamic_one_would_have_become(zero_points):
    """int8w_from_parts (a cache's parts straight into rowgemm's form) gives the bits int8w_linears gives the dynamic
    layer stream.int8_from_parts builds of the same parts: symmetric parts as they are, affine ones quantized per row."""
    from specviz.models import stream

    gen = torch.Generator().manual_seed(3)
    ints = torch.randint(-127, 128, (40, 24), generator=gen, dtype=torch.int8)
    scales = torch.rand(40, generator=gen, dtype=torch.float64) * 0.01 + 1e-4
    zeros = torch.zeros(40, dtype=torch.int64) if zero_points == "none" else torch.randint(-3, 4, (40,), generator=gen)
    bias = torch.randn(40, generator=gen)
    direct = int8w.int8w_from_parts(ints, scales, zeros, bias, KERNEL)
    dynamic = torch.nn.Sequential(stream.int8_from_parts(ints, scales, zeros, bias))
    assert int8w.int8w_linears(dynamic, KERNEL) == 1
    made = dynamic[0]
    assert torch.equal(direct.panels, made.panels) and torch.equal(direct.scale, made.scale)
    assert direct.scale.dtype == made.scale.dtype == torch.float32 and torch.equal(direct.bias, made.bias)
    if zero_points == "none":
        assert torch.equal(rowgemm.unpack(direct.panels, 40), ints)
    x = torch.randn(3, 24, generator=gen)
    assert torch.equal(direct(x), made(x))
