"""Pre-packed CPU linears: same results as torch's linear, every row the same bits at every pass size, released plain weights."""

import pytest
import torch

from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.drafters.model import ModelDrafter
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.models import load_pair, packed
from specviz.models.tiny import _build_tiny_random

needs_packing = pytest.mark.skipif(not packed.packing_works(torch.float32),
                                   reason="oneDNN packed linears are not row-invariant on this CPU (the models keep torch's linears)")


@needs_packing
def test_a_packed_linear_matches_torch_and_gives_each_row_the_same_bits_at_any_pass_size():
    gen = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(640, 192, generator=gen), torch.randn(640, generator=gen)
    layer = packed.PackedLinear(weight, bias)
    rows = torch.randn(1, 17, 192, generator=gen)
    with torch.no_grad():
        full = layer(rows)  # (1, 17, 640)
        torch.testing.assert_close(full, torch.nn.functional.linear(rows, weight, bias), rtol=1e-5, atol=1e-4)
        for n in (1, 2, 4, 5, 16):
            assert torch.equal(layer(rows[:, :n]), full[:, :n])  # bits, not closeness
        assert torch.equal(layer.unpacked_weight(), weight)
    assert layer.nbytes() == weight.numel() * 4


@needs_packing
def test_pack_linears_replaces_every_linear_and_keeps_the_models_output():
    _, target, _ = _build_tiny_random()
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    with torch.no_grad():
        before = target(input_ids=ids).logits
        n_linear = sum(type(m) is torch.nn.Linear for m in target.modules())
        assert packed.pack_linears(target) == n_linear > 0
        assert not any(type(m) is torch.nn.Linear for m in target.modules())
        assert packed.is_packed(target)
        torch.testing.assert_close(target(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)


def test_a_shape_that_fails_the_row_check_leaves_the_model_untouched(monkeypatch):
    _, target, _ = _build_tiny_random()
    monkeypatch.setattr(packed, "packing_works", lambda dtype=torch.float32: True)
    monkeypatch.setattr(packed, "_rows_agree", lambda layer, gen: False)
    assert packed.pack_linears(target) == 0
    assert not packed.is_packed(target)


def test_a_cuda_or_bf16_model_without_a_row_invariant_kernel_is_not_packed(monkeypatch):
    _, target, _ = _build_tiny_random()
    monkeypatch.setattr(packed, "packing_works", lambda dtype=torch.float32: False)
    assert packed.pack_linears(target) == 0 and not packed.is_packed(target)


@needs_packing
def test_the_loaded_pair_is_packed_and_still_gives_the_targets_greedy_tokens():
    assert not packed.is_packed(load_pair("tiny-random", "int8").draft)  # int8 drafts keep their numerics
    pair = load_pair("tiny-random")
    assert pair.draft_precision == "fp32"
    assert packed.is_packed(pair.target) and packed.is_packed(pair.draft)
    assert "packed for oneDNN" in pair.precision_reason
    assert pair.weight_bytes >= packed.packed_bytes(pair.target) > 0  # the memory shown counts the packed weights
    config = GenerationConfig(max_new_tokens=24, gamma=5, sampling=SamplingConfig("greedy"))
    prompt = [11, 12, 13, 14]
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, prompt, config))
    spec = drain(speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, prompt, config))
    assert spec.tokens == base.tokens


def test_the_operator_can_keep_torchs_linears(monkeypatch):
    monkeypatch.setenv("SPECVIZ_PACKED", "0")
    _, target, _ = _build_tiny_random()
    assert packed.pack_linears(target) == 0 and not packed.is_packed(target)
    assert packed.describe(0) == "torch's plain linears (SPECVIZ_PACKED=0)"
    pair = load_pair("tiny-random")
    assert not packed.is_packed(pair.target) and "SPECVIZ_PACKED=0" in pair.precision_reason
