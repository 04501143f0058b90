"""Greedy speculative output is token-identical to target-only greedy on the real packaged pairs."""

import pytest

from specviz.core.progress import drain
from specviz.core.drafters.model import ModelDrafter
from specviz.core.drafters.ngram import NgramDrafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import GenerationConfig
from specviz.models import load_pair
from specviz.core.sampling import SamplingConfig

PROMPTS = {
    "code": "def fibonacci(n):",
    "story": "Once upon a time, in a small village by the sea,",
}
NEW_TOKENS = 48


def _config(gamma: int) -> GenerationConfig:
    # EOS would end a run early and weaken the check, so the full 48 tokens are always produced
    return GenerationConfig(max_new_tokens=NEW_TOKENS, gamma=gamma, sampling=SamplingConfig("greedy"), stop_at_eos=False)


def _check_identity(pair, baselines, prompt_name: str, gamma: int, drafter) -> None:
    ids = pair.tokenizer(PROMPTS[prompt_name])["input_ids"]
    if prompt_name not in baselines:
        baselines[prompt_name] = drain(autoregressive_generate(pair.target, pair.tokenizer, ids, _config(gamma)))
    base = baselines[prompt_name]
    spec = drain(speculative_generate(pair.target, drafter, pair.tokenizer, ids, _config(gamma)))
    assert len(spec.tokens) == NEW_TOKENS
    assert spec.tokens == base.tokens, (
        f"diverged at token {next(i for i, (a, b) in enumerate(zip(spec.tokens, base.tokens)) if a != b)}:\n"
        f"speculative: {spec.text!r}\nbaseline:    {base.text!r}"
    )
    # a real draft must do real work: at least some drafted tokens are accepted
    assert spec.accepted > 0


@pytest.fixture(scope="module")
def smollm():
    return load_pair("smollm2-135m")


@pytest.fixture(scope="module")
def smollm_baselines():
    return {}


@pytest.mark.real
@pytest.mark.parametrize("prompt_name", PROMPTS)
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_smollm2_greedy_identity(smollm, smollm_baselines, prompt_name, gamma):
    _check_identity(smollm, smollm_baselines, prompt_name, gamma, ModelDrafter(smollm.draft))


@pytest.mark.real
def test_smollm2_ngram_drafter_identity(smollm, smollm_baselines):
    _check_identity(smollm, smollm_baselines, "code", 4, NgramDrafter())


@pytest.fixture(scope="module")
def qwen_baselines():
    return {}


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("prompt_name", PROMPTS)
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_qwen_coder_greedy_identity(qwen_pair, qwen_baselines, prompt_name, gamma):
    _check_identity(qwen_pair, qwen_baselines, prompt_name, gamma, ModelDrafter(qwen_pair.draft))
