"""The first divergence of two greedy runs and the target's own top-2 gap there; bf16 targets on a real pair."""

import pytest
import torch

from specviz.core.divergence import first_divergence
from specviz.core.drafters import ModelDrafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.models import load_pair


def test_agreeing_runs_have_no_divergence():
    pair = load_pair("tiny-random")
    assert first_divergence(pair.target, [1, 2, 3], (5, 6, 7), (5, 6, 7)) is None
    assert first_divergence(pair.target, [1, 2, 3], (5, 6), (5, 6, 7)) is None  # a prefix (EOS) is agreement


def test_divergence_reports_the_targets_own_gap_at_that_position():
    pair = load_pair("tiny-random")
    prompt, base = [100, 101, 102], (40, 41, 42, 43)
    spec = (40, 41, 99, 43)
    d = first_divergence(pair.target, prompt, spec, base)
    assert d is not None and d.position == 2 and (d.speculative_id, d.baseline_id) == (99, 42)
    with torch.no_grad():
        row = pair.target(input_ids=torch.tensor([prompt + [40, 41]])).logits[0, -1]  # (V,)
    top = torch.topk(row, 2)
    assert d.top_ids == (int(top.indices[0]), int(top.indices[1]))
    assert d.top2_gap == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-5)
    assert d.pair_gap == pytest.approx(abs(float(row[42] - row[99])), abs=1e-5)


PROMPTS = {
    "code": "def fibonacci(n):",
    "list": "Shopping list:\n1. apples\n2.",
    "story": "Once upon a time, in a small village by the sea,",
}


@pytest.fixture(scope="module")
def smollm_bf16():
    return load_pair("smollm2-135m", target_precision="bf16")


@pytest.mark.real
@pytest.mark.parametrize("prompt_name", PROMPTS)
def test_smollm2_bf16_target_breaks_identity_only_at_near_ties(smollm_bf16, prompt_name):
    """bf16 is offered as "not bit-exact here": where it leaves the target's own text, the target's top two were close.

    A verify pass and a one-token step round differently in bf16 (up to ~1e-2 on a logit here), so the
    only divergences allowed are at positions whose top-2 gap is of that order; anything larger would
    be a bug in the engine, not arithmetic.
    """
    pair = smollm_bf16
    assert not pair.bit_exact and pair.target_precision == "bf16"
    ids = pair.tokenizer(PROMPTS[prompt_name])["input_ids"]
    config = GenerationConfig(max_new_tokens=32, gamma=4, sampling=SamplingConfig("greedy"), stop_at_eos=False)
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, ids, config))
    spec = drain(speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, ids, config))
    d = first_divergence(pair.target, ids, spec.tokens, base.tokens)
    print(prompt_name, "identical" if d is None else d)
    if d is not None:
        assert d.pair_gap < 0.25 and d.top2_gap < 0.25, d


@pytest.mark.real
@pytest.mark.slow
def test_qwen_coder_bf16_story_divergence_is_a_near_tie():
    """The story preset diverged in bf16 before: the check says where, and that it was a near-tie (run under the qwen flock)."""
    pair = load_pair("qwen-coder", target_precision="bf16")
    ids = pair.tokenizer(PROMPTS["story"])["input_ids"]
    config = GenerationConfig(max_new_tokens=24, gamma=4, sampling=SamplingConfig("greedy"), stop_at_eos=False)
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, ids, config))
    spec = drain(speculative_generate(pair.target, ModelDrafter(pair.draft), pair.tokenizer, ids, config))
    d = first_divergence(pair.target, ids, spec.tokens, base.tokens)
    print("qwen bf16 story:", "identical" if d is None else d)
    if d is not None:
        assert d.pair_gap < 0.25 and d.top2_gap < 0.25, d
