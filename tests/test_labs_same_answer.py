"""The "Same answer" lab's computation on tiny random models: memo exactness, greedy identity, the sampling test."""

import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.core import drafters
from specviz.core.drafters.model import ModelDrafter
from specviz.core.engine import speculative_generate
from specviz.core.rounds import CachedTarget, solo
from specviz.core.trace import GenerationConfig
from specviz.core.progress import drain
from specviz.labs.same_answer import (
    MemoTarget, sampling_drafter,
    ExactLaw, GreedyComparison, SampleConfig, SampleCounts, SpecConfig, binned, exact_law,
    fit_test, greedy_comparison, histogram_rows, memo_drafter, reference_job, speculative_job, target_memo,
)
from specviz.core.sampling import SamplingConfig, TopKShortcut, acceptance_rule, logits_to_probs, verify_draft
from specviz.viz.same_answer import greedy_table, histogram_figure
from tests.test_engine import TOK

V = 8
PROMPT = [1, 5, 2, 7]
SAMPLING = SamplingConfig("sample", temperature=0.7, top_p=0.95, seed=3)


def tiny_lm(seed: int, vocab: int = V, scale: float = 1.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)  # test-only: builds weights, never used while generating
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper than the default init, so a few continuations dominate (as in real text)
        model.lm_head.weight.mul_(scale)
    return model




@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, scale=5.0)


@pytest.fixture(scope="module")
def draft():
    return tiny_lm(1, scale=5.0)


def direct_p(model, ids, sampling=SAMPLING):
    """p at the end of ids from one full forward pass with no cache (the reference)."""
    with torch.inference_mode():
        return logits_to_probs(model(input_ids=torch.tensor([list(ids)])).logits[0, -1], sampling)


# ------------------------------------------------------------------------------------------
# Memoised distributions are the model's own
# ------------------------------------------------------------------------------------------


def test_prefix_memo_matches_a_full_forward_and_counts_hits(target):
    memo = target_memo(target, SAMPLING)
    seqs = [PROMPT + [3], PROMPT + [3, 4], PROMPT + [6], PROMPT + [3, 4]]
    for ids in seqs:
        got = solo(memo.probs(ids, 2))  # (2, V)
        assert torch.allclose(got[0], direct_p(target, ids[:-1]), atol=1e-5)
        assert torch.allclose(got[1], direct_p(target, ids), atol=1e-5)
    assert memo.misses == 4 and memo.hits == 4  # 8 rows asked, 4 distinct prefixes: P, P+3, P+3+4, P+6


def test_prefix_memo_evicts_but_stays_correct(target):
    memo = target_memo(target, SAMPLING, max_bytes=3 * V * 4)  # room for three rows
    for t in range(V):
        solo(memo.probs(PROMPT + [t], 1))
    assert len(memo.rows) == 3 and memo.bytes == 3 * V * 4
    assert torch.allclose(solo(memo.probs(PROMPT + [0], 1))[0], direct_p(target, PROMPT + [0]), atol=1e-5)


def test_memo_target_matches_the_engines_default(target):
    memo, plain = MemoTarget(target_memo(target, SAMPLING)), CachedTarget(target, SAMPLING)
    solo(plain.prefill(PROMPT))
    assert torch.allclose(solo(memo.probs(PROMPT + [2, 3], 3)).p, solo(plain.probs(PROMPT + [2, 3], 3)).p, atol=1e-5)
    tokens, parents = [2, 4, 3, 1], [-1, -1, 0, 2]  # two children of the root, a branch of three under the first
    assert torch.allclose(solo(memo.tree_probs(PROMPT, tokens, parents)).p,
                          solo(plain.tree_probs(PROMPT, tokens, parents)).p, atol=1e-5)


def test_memoised_tree_run_replays_the_plain_tree_run(target, draft):
    """The Same answer lab's tree: q and p from memos, every draw and verdict as in a plain tree run."""
    vocab = target.config.vocab_size
    for seed in range(4):
        cfg = GenerationConfig(max_new_tokens=3, gamma=3, sampling=SamplingConfig(**{**SAMPLING.__dict__, "seed": seed}))
        memoised = sampling_drafter("tree", draft, target, SAMPLING, vocab)
        a = drain(speculative_generate(target, drafters.build("tree", draft), TOK, PROMPT, cfg))
        b = drain(speculative_generate(target, memoised, TOK, PROMPT, cfg, target_probs=MemoTarget(target_memo(target, SAMPLING))))
        assert a.tokens == b.tokens and [r.uniforms for r in a.rounds] == [r.uniforms for r in b.rounds]
        assert all(r.tree is not None for r in b.rounds if r.draft_ids)


def test_memo_drafter_drafts_what_model_drafter_drafts(target, draft):
    memoised = memo_drafter(draft, SAMPLING, V)
    assert isinstance(memoised, ModelDrafter)  # the one draft loop, reading q from a memo
    for seed in range(5):
        a = ModelDrafter(draft).start(PROMPT, SAMPLING, V).propose(PROMPT, 3, torch.Generator().manual_seed(seed))
        b = memoised.start(PROMPT, SAMPLING, V).propose(PROMPT, 3, torch.Generator().manual_seed(seed))
        assert a.tokens == b.tokens and torch.allclose(a.q, b.q, atol=1e-5)


def test_memoised_engine_run_replays_the_plain_run(target, draft):
    """Same seed, same sample: memoising changes the cost, not a single draw."""
    memoised, memo = memo_drafter(draft, SAMPLING, V), target_memo(target, SAMPLING)
    for seed in range(5):
        cfg = GenerationConfig(max_new_tokens=4, gamma=3, sampling=SamplingConfig(**{**SAMPLING.__dict__, "seed": seed}))
        a = drain(speculative_generate(target, ModelDrafter(draft), TOK, PROMPT, cfg))
        b = drain(speculative_generate(target, memoised, TOK, PROMPT, cfg, target_probs=MemoTarget(memo)))
        assert a.tokens == b.tokens and [r.uniforms for r in a.rounds] == [r.uniforms for r in b.rounds]


def test_memo_drafter_refuses_other_sampling_settings(draft):
    with pytest.raises(ValueError):
        memo_drafter(draft, SAMPLING, V).start(PROMPT, SamplingConfig("sample", temperature=1.5), V)
    with pytest.raises(ValueError):  # a memo keeps no logits, so no confidence stop
        ModelDrafter(draft, min_confidence=0.2, q_memo=memo_drafter(draft, SAMPLING, V).q_memo)


# ------------------------------------------------------------------------------------------
# Greedy identity
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_comparison_is_identical(target, draft, gamma):
    cfg = GenerationConfig(max_new_tokens=16, gamma=gamma, sampling=SamplingConfig("greedy"))
    cmp = drain(greedy_comparison(target, ModelDrafter(draft), TOK, PROMPT, cfg))
    assert cmp.identical and cmp.first_divergence is None and cmp.n_same == cmp.n_compared == 16
    assert cmp.target_calls_spec < cmp.target_calls_plain == 16 or cmp.accepted == 0
    table = greedy_table(cmp, {})
    assert len(table) == 16 and set(table["same?"]) == {"✓"}


def test_greedy_comparison_yields_progress_and_refuses_sampling(target, draft):
    cfg = GenerationConfig(max_new_tokens=6, gamma=2, sampling=SamplingConfig("greedy"))
    steps = list(itertools.islice(greedy_comparison(target, ModelDrafter(draft), TOK, PROMPT, cfg), 100))
    assert steps and steps[-1].done == steps[-1].total == 12
    with pytest.raises(ValueError):
        drain(greedy_comparison(target, ModelDrafter(draft), TOK, PROMPT, GenerationConfig(sampling=SAMPLING)))


def test_first_divergence_is_reported_not_hidden():
    base = dict(spec_texts=("a", "b", "x", "d"), plain_texts=("a", "b", "c", "d"), spec_text="abxd", plain_text="abcd",
                drafter="model", gamma=4, target_calls_spec=2, target_calls_plain=4, drafted=4, accepted=3,
                spec_ms=1.0, plain_ms=2.0)
    cmp = GreedyComparison(spec_tokens=(1, 2, 9, 4), plain_tokens=(1, 2, 3, 4), **base)
    assert not cmp.identical and cmp.first_divergence == 2 and cmp.n_same == 3
    assert list(greedy_table(cmp, {})["same?"]) == ["✓", "✓", "✗ differs", "✓"]
    shorter = GreedyComparison(spec_tokens=(1, 2, 3), plain_tokens=(1, 2, 3, 4), **base)
    assert shorter.first_divergence == 3 and not shorter.identical


# ------------------------------------------------------------------------------------------
# The wrong rule, the exact law, the test
# ------------------------------------------------------------------------------------------


def test_topk_shortcut_accepts_inside_the_top_k_only():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    gen = torch.Generator().manual_seed(0)
    v = TopKShortcut(2)(p, q, torch.tensor([3]), gen)
    assert v.n_accepted == 0 and v.accept_probs == (0.0,) and v.next_origin == "correction"
    assert torch.equal(v.residual, p[0])  # the shortcut corrects from p itself, not the residual
    v = TopKShortcut(2)(p, torch.tensor([[0.0, 1.0, 0.0, 0.0]]), torch.tensor([1]), gen)
    assert v.n_accepted == 1 and v.next_origin == "bonus"
    exact = verify_draft(p, torch.tensor([[0.0, 1.0, 0.0, 0.0]]), torch.tensor([1]), torch.Generator().manual_seed(0))
    assert exact.accept_probs == pytest.approx((0.3,))  # the exact rule would accept it only 30% of the time
    assert acceptance_rule("exact") is verify_draft and acceptance_rule("topk", 2) == TopKShortcut(2)
    with pytest.raises(ValueError):
        acceptance_rule("nearly", 2)


def test_exact_law_matches_brute_force(target):
    cfg = SampleConfig(SAMPLING, n_samples=500, n_tokens=2)
    law = drain(exact_law(target_memo(target, SAMPLING), TOK, PROMPT, cfg))
    p1 = direct_p(target, PROMPT)
    p2 = {a: direct_p(target, PROMPT + [a]) for a in range(V) if p1[a] > 0}
    brute = {(a, b): float(p1[a] * p2[a][b]) for a in p2 for b in range(V)}  # every two-token continuation
    for seq, pr in zip(law.sequences, law.probs):
        assert pr == pytest.approx(brute[seq], rel=1e-4) and 500 * pr >= 5.0
    assert set(law.sequences) == {s for s, pr in brute.items() if 500 * pr >= 5.0}
    assert list(law.probs) == sorted(law.probs, reverse=True)


def _counts(law: ExactLaw, shares: list[float], n: int) -> SampleCounts:
    counts = tuple((s, round(n * x)) for s, x in zip(law.sequences, shares))
    return SampleCounts("speculative", "exact", counts, n, 0.0, 0, 0, 0, 0)


def test_fit_test_on_exact_counts_and_on_skewed_counts():
    law = ExactLaw(((1,), (2,), (3,)), (("a",), ("b",), ("c",)), (0.5, 0.3, 0.15), 1000, 0)
    good = fit_test(law, _counts(law, [0.5, 0.3, 0.15], 1000))
    assert good.pvalue > 0.99 and good.tv < 1e-9 and good.n_bins == 4 and good.dof == 3
    bad = fit_test(law, _counts(law, [0.7, 0.2, 0.05], 1000))
    assert bad.pvalue < 1e-10 and bad.tv == pytest.approx(0.2) and bad.log10_p < -10
    observed, expected = binned(law, _counts(law, [0.5, 0.3, 0.15], 1000))
    assert observed[-1] == 50 and expected[-1] == pytest.approx(50)  # "other" holds the rest
    tiny_other = ExactLaw(((1,), (2,)), (("a",), ("b",)), (0.6, 0.398), 1000, 0)
    assert len(binned(tiny_other, _counts(tiny_other, [0.6, 0.4], 1000))[0]) == 2  # 2 expected: pooled


def test_configs_refuse_bad_values():
    with pytest.raises(ValueError):
        SampleConfig(SamplingConfig("greedy"))
    with pytest.raises(ValueError):
        SampleConfig(SAMPLING, n_tokens=4)
    with pytest.raises(ValueError):
        drain(reference_job(None, TOK, [], SampleConfig(SAMPLING)))


@pytest.mark.slow
@pytest.mark.parametrize("n_tokens", [1, 2])
def test_exact_rule_passes_and_topk_shortcut_is_caught(target, draft, n_tokens):
    """The statistical test the page runs: N real engine samples against the exact law, fixed seeds."""
    cfg = SampleConfig(SAMPLING, n_samples=3000, n_tokens=n_tokens)
    ref = drain(reference_job(target, TOK, PROMPT, cfg))
    assert len(ref.law.sequences) >= 4  # a real test: several bins
    exact = drain(speculative_job(target, draft, TOK, PROMPT, cfg, SpecConfig(gamma=4, rule="exact")))
    wrong = drain(speculative_job(target, draft, TOK, PROMPT, cfg, SpecConfig(gamma=4, rule="topk", top_k=2)))
    assert exact.drafted > 0 and 0 < exact.accepted < exact.drafted  # the rule really ran, accepting and rejecting
    assert exact.n == wrong.n == ref.target.n == 3000
    alpha = 1e-3
    assert fit_test(ref.law, ref.target).pvalue > alpha
    assert fit_test(ref.law, exact).pvalue > alpha
    caught = fit_test(ref.law, wrong)
    assert caught.pvalue < 1e-6 and caught.tv > fit_test(ref.law, exact).tv
    rows = histogram_rows(ref.law, ref.target, exact)
    assert sum(r.exact for r in rows) == pytest.approx(1.0) and sum(r.spec_share for r in rows) == pytest.approx(1.0)
    fig = histogram_figure(rows, {})
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and len(fig.data) == 3


def test_ngram_drafter_path_runs(target):
    cfg = SampleConfig(SAMPLING, n_samples=50, n_tokens=2)
    counts = drain(speculative_job(target, None, TOK, PROMPT + PROMPT, cfg, SpecConfig(drafter="ngram")))
    assert counts.n == 50 and sum(c for _, c in counts.counts) == 50
    with pytest.raises(ValueError):
        drain(speculative_job(target, None, TOK, PROMPT, cfg, SpecConfig(drafter="model")))
