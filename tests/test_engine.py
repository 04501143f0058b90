"""Engine mechanics on tiny random models: KV rollback, greedy identity, sampling law, traces."""

from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.core.progress import drain
from specviz.core.rounds import Session, Draft
from specviz.core.drafters.model import ModelDrafter
from specviz.core.drafters.ngram import NgramDrafter, find_ngram_continuation
from specviz.core.engine import autoregressive_generate, speculative_generate, speculative_program
from specviz.core.trace import GenerationConfig
from specviz.core.kv import CachedLM
from specviz.core.metrics import acceptance_drafted, tokens_per_target_call
from specviz.core.sampling import SamplingConfig, logits_to_probs
from specviz.serve.batch import run_together

V = 12


def tiny_lm(seed: int, vocab: int = V) -> LlamaForCausalLM:
    torch.manual_seed(seed)  # test-only: builds weights, never used while generating
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )
    return LlamaForCausalLM(cfg).eval()


class IdTokenizer:
    """Names each id; enough for traces on models without a real vocabulary."""

    def batch_decode(self, seqs):
        return [f"<{s[0]}>" for s in seqs]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


TOK = IdTokenizer()
PROMPT = [1, 5, 2, 7]


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0)


@pytest.fixture(scope="module")
def other():
    return tiny_lm(1)


@dataclass(frozen=True)
class WrongDrafter:
    """Always proposes a token the target does not pick greedily (its argmax + 1)."""

    target: torch.nn.Module
    name: str = "always-wrong"

    def start(self, prompt_ids, sampling, vocab_size):
        lm = CachedLM(self.target)

        class WrongSession(Session):
            def propose_steps(self, ids, gamma, generator):
                seq = list(ids)
                for _ in range(gamma):
                    seq.append((int((yield lm.feed(seq, 1)).logits[0].argmax()) + 1) % vocab_size)
                toks = tuple(seq[len(ids):])
                return Draft(toks, logits_to_probs(torch.nn.functional.one_hot(torch.tensor(toks), vocab_size).float(), sampling))

        return WrongSession()


def _greedy(n=48, gamma=4):
    return GenerationConfig(max_new_tokens=n, gamma=gamma, sampling=SamplingConfig("greedy"))


def test_cache_rollback_matches_no_cache_recompute(target):
    lm = CachedLM(target)
    lm.logits(PROMPT + [3, 3, 9, 4], 5)  # a draft of 4 that gets rejected at its second token
    got = lm.logits(PROMPT + [3, 8, 6], 2)  # accepted [3], correction 8, next draft 6
    assert lm.cache.get_seq_length() == len(PROMPT) + 3 == len(lm.ids)
    with torch.inference_mode():
        full = target(input_ids=torch.tensor([PROMPT + [3, 8, 6]])).logits[0, -2:]
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_crop_uses_negative_counts_in_this_transformers(target):
    lm = CachedLM(target)
    lm.logits(PROMPT + [1, 2, 3], 1)
    lm.crop(len(PROMPT))
    assert lm.cache.get_seq_length() == len(PROMPT) and lm.ids == PROMPT


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_identical_with_always_right_drafter(target, gamma):
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy(gamma=gamma)))
    spec = drain(speculative_generate(target, ModelDrafter(target), TOK, PROMPT, _greedy(gamma=gamma)))
    assert spec.tokens == base.tokens and len(spec.tokens) == 48
    assert acceptance_drafted(spec.rounds) == 1.0
    assert all(r.next_origin == "bonus" for r in spec.rounds[:-1])


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_identical_with_always_wrong_drafter(target, gamma):
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy(gamma=gamma)))
    spec = drain(speculative_generate(target, WrongDrafter(target), TOK, PROMPT, _greedy(gamma=gamma)))
    assert spec.tokens == base.tokens
    assert acceptance_drafted(spec.rounds) == 0.0 and tokens_per_target_call(spec.rounds) == 1.0
    assert all(r.next_origin == "correction" for r in spec.rounds if r.draft_ids)


@pytest.mark.parametrize("gamma", [2, 5])
def test_greedy_identical_with_an_imperfect_model_drafter(target, other, gamma):
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy(60, gamma)))
    spec = drain(speculative_generate(target, ModelDrafter(other), TOK, PROMPT, _greedy(60, gamma)))
    assert spec.tokens == base.tokens


def test_ngram_drafter_is_lossless_and_copies_repeats(target):
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4]
    base = drain(autoregressive_generate(target, TOK, prompt, _greedy(40)))
    spec = drain(speculative_generate(target, NgramDrafter(), TOK, prompt, _greedy(40)))
    assert spec.tokens == base.tokens
    assert find_ngram_continuation(prompt, 3, 1, 4) == [5, 6, 7, 3]
    assert find_ngram_continuation([1, 2, 3], 3, 1, 4) == []


def test_trace_fields_are_consistent(target, other):
    spec = drain(speculative_generate(target, ModelDrafter(other), TOK, PROMPT, _greedy(30, 4)))
    position = 0
    for i, r in enumerate(spec.rounds):
        assert r.index == i and r.position == position
        k = len(r.draft_ids)
        assert len(r.draft_texts) == len(r.p_draft) == len(r.q_draft) == len(r.accept_probs) == len(r.uniforms) == k
        assert r.accepted == tuple(j < r.n_accepted for j in range(k))
        assert r.next_text == f"<{r.next_id}>"
        if r.next_origin == "correction":
            assert r.q_top is not None and r.residual_top.ids[0] == r.next_id  # greedy: the residual is one-hot
        assert r.p_top is not None and len(r.p_top.ids) <= 20
        position += len(r.new_ids)
    assert spec.tokens == tuple(t for r in spec.rounds for t in r.new_ids)[:30]
    assert len(spec.tokens) == 30 and spec.stop_reason == "max_new_tokens"


def test_stops_at_eos(target):
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy(40)))
    eos = base.tokens[10]
    cut = base.tokens[: base.tokens.index(eos) + 1]
    for steps in (
        autoregressive_generate(target, TOK, PROMPT, _greedy(40), eos_ids=[eos]),
        speculative_generate(target, ModelDrafter(target), TOK, PROMPT, _greedy(40), eos_ids=[eos]),
    ):
        g = drain(steps)
        assert g.tokens == cut and g.stop_reason == "eos"


def test_yields_rounds_before_finishing(target):
    steps = speculative_generate(target, ModelDrafter(target), TOK, PROMPT, _greedy(20, 4))
    first = next(steps)
    assert first.index == 0 and first.n_accepted == 4
    assert drain(steps).rounds[0] == first


def test_rejects_bad_configs_and_empty_prompts(target):
    with pytest.raises(ValueError):
        GenerationConfig(gamma=0)
    with pytest.raises(ValueError):
        GenerationConfig(gamma=17)
    with pytest.raises(ValueError):
        drain(speculative_generate(target, NgramDrafter(), TOK, [], _greedy()))


def test_sampling_replays_bit_for_bit_with_the_same_seed(target, other):
    cfg = GenerationConfig(max_new_tokens=20, gamma=3, sampling=SamplingConfig("sample", temperature=0.9, seed=7))
    a = drain(speculative_generate(target, ModelDrafter(other), TOK, PROMPT, cfg))
    b = drain(speculative_generate(target, ModelDrafter(other), TOK, PROMPT, cfg))
    assert a.tokens == b.tokens and [r.uniforms for r in a.rounds] == [r.uniforms for r in b.rounds]


@pytest.mark.slow
def test_sampled_two_token_law_matches_target_exactly():
    """First two tokens of speculative sampling vs the target's exact joint law p(t1) p(t2|t1)."""
    vocab = 6
    target, draft = tiny_lm(3, vocab), tiny_lm(4, vocab)
    sampling = SamplingConfig("sample", temperature=2.0, top_k=5)
    prompt = [1, 2]
    with torch.inference_mode():
        p1 = logits_to_probs(target(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)
        seconds = torch.tensor([prompt + [t] for t in range(vocab)])
        p2 = logits_to_probs(target(input_ids=seconds).logits[:, -1], sampling)  # (V, V)
    joint = (p1[:, None] * p2).flatten()  # (V*V,)
    counts = torch.zeros(vocab * vocab)
    draws = 2500
    # the runs advance together through the batched executor (each run's answers are its own: tests/test_serve.py)
    gens, _, _ = run_together([speculative_program(target, ModelDrafter(draft), TOK, prompt, GenerationConfig(
        max_new_tokens=3, gamma=2, sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed})))
        for seed in range(draws)], target)
    for gen in gens:
        t1, t2 = gen.tokens[:2]
        counts[t1 * vocab + t2] += 1
    keep = joint * draws > 5
    obs, exp = counts[keep].double(), (joint[keep] * draws).double()
    assert chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-3


def test_requests_sharing_models_never_disturb_each_other(target, other):
    """Two sessions' runs over the same read-only models, stepped in turn and in threads, equal each run alone.

    Each request owns its KV caches and its torch.Generator; nothing mutable is shared, so the
    order in which a server advances requests cannot change any request's tokens or draws.
    """
    import threading

    configs = [GenerationConfig(max_new_tokens=24, gamma=3, sampling=SamplingConfig(mode="sample", seed=s))
               for s in (11, 12)] + [GenerationConfig(max_new_tokens=24, gamma=4)]
    prompts = [PROMPT, [3, 3, 9], [4, 1]]

    def start(i):
        return speculative_generate(target, ModelDrafter(other), TOK, prompts[i], configs[i], ())

    alone = [drain(start(i)) for i in range(3)]
    # stepped in turn, round by round, as one worker interleaving sessions would
    gens, traces, done = [start(i) for i in range(3)], [[], [], []], [None, None, None]
    while any(d is None for d in done):
        for i, g in enumerate(gens):
            if done[i] is None:
                try:
                    traces[i].append(next(g))
                except StopIteration as stop:
                    done[i] = stop.value
    # and truly at once, in threads
    threaded = [None, None, None]

    def work(i):
        threaded[i] = drain(start(i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for i in range(3):
        assert done[i].tokens == alone[i].tokens == threaded[i].tokens
        assert [r.uniforms for r in done[i].rounds] == [r.uniforms for r in alone[i].rounds]
