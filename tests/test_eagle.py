"""The EAGLE-style head: exact whatever it guesses (greedy identity, the sampled law), and it learns the target it reads."""

from collections import Counter

import pytest
import torch

from specviz.core.draft_vocab import DraftVocab, most_frequent
from specviz.core import drafters
from specviz.core.drafters.eagle import EAGLE_MIN_CONFIDENCE, EagleDrafter, EagleTreeDrafter
from specviz.core.drafters.tree import TreeConfig
from specviz.core.engine import autoregressive_generate, speculative_generate, speculative_program
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.serve.batch import run_together
from specviz.core.head import EagleHead
from specviz.models.tiny import _build_tiny_random
from specviz.train.head import TrainConfig, acceptance_by_depth, collect, expected_acceptance, train, unrolled_guesses
from tests.test_engine import TOK, tiny_lm
from tests.test_tree import chi_square_pvalue, joint_two

PROMPTS = ["def add(a, b):", "Once upon a time", "for i in range(10):", "The cat sat on", "import numpy as np",
           "class Point:", "Dear teacher,", "x = [1, 2, 3]"]


def _head(target, vocab: DraftVocab, seed: int = 0) -> EagleHead:
    with torch.random.fork_rng(devices=[]):  # a seeded init that leaves the caller's generator alone
        torch.manual_seed(seed)
        return EagleHead(target, vocab).eval()


@pytest.fixture(scope="module")
def tiny():
    """The tiny-random pair's target and tokenizer, and what it says: 128 sampled continuations of random 6-byte prompts
    (made in one batch by transformers' generate: test data; the head's real data come from specviz's own runs)."""
    tok, target, _ = _build_tiny_random()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(32, 127, (128, 6), generator=gen)  # printable bytes
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(0)
        out = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0, top_p=1.0,
                              temperature=1.0, max_new_tokens=64, min_new_tokens=64, pad_token_id=256)
    sequences = out.tolist()
    counts = torch.bincount(out.flatten(), minlength=target.config.vocab_size)
    return tok, target, sequences, most_frequent(counts, 192)


def _greedy_pair(target, tok, drafter, prompt: str, gamma: int):
    ids = tok(prompt)["input_ids"]
    cfg = GenerationConfig(max_new_tokens=40, gamma=gamma, stop_at_eos=False)
    return drain(speculative_generate(target, drafter, tok, ids, cfg)), drain(autoregressive_generate(target, tok, ids, cfg))


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_eagle_runs_are_identical_to_the_target_alone_even_untrained(tiny, gamma):
    tok, target, _, vocab = tiny
    spec, base = _greedy_pair(target, tok, EagleDrafter(_head(target, vocab)), "def add(a, b):", gamma)
    assert spec.tokens == base.tokens and spec.drafter == "eagle"
    assert sum(len(r.draft_ids) for r in spec.rounds) > 0


def test_an_unsure_head_stops_its_chain_early_and_the_output_stays_the_targets(tiny):
    """The confidence stop (adaptive runs): an untrained head is never 99 % sure, so every draft is one token long."""
    tok, target, _, vocab = tiny
    spec, base = _greedy_pair(target, tok, EagleDrafter(_head(target, vocab), min_confidence=0.99), "def add(a, b):", 4)
    assert spec.tokens == base.tokens
    drafting = [len(r.draft_ids) for r in spec.rounds if r.draft_ids]  # (a round with no room left drafts nothing)
    assert len(drafting) > 10 and set(drafting) == {1}
    # the registry's head chain stops when unsure in adaptive runs only, as the model drafter does
    head = _head(target, vocab)
    assert drafters.build("eagle", target=target, head=head, adaptive=True).min_confidence == EAGLE_MIN_CONFIDENCE > 0
    assert drafters.build("eagle", target=target, head=head).min_confidence == 0.0


@pytest.mark.parametrize("config", [TreeConfig(budget=12, branching=2, depth=5, min_score=0.0), TreeConfig()])
def test_greedy_eagle_tree_runs_are_identical_to_the_target_alone(tiny, config):
    tok, target, _, vocab = tiny
    spec, base = _greedy_pair(target, tok, EagleTreeDrafter(_head(target, vocab), config), "def add(a, b):", 4)
    assert spec.tokens == base.tokens and spec.drafter == "eagle-tree"
    if config.min_score == 0.0:  # an untrained head is unsure: only a tree that keeps unsure nodes drafts many
        assert max(len(r.tree.nodes) for r in spec.rounds if r.tree) > 4


@pytest.mark.parametrize("make", [lambda head: EagleDrafter(head),
                                  lambda head: EagleDrafter(head, min_confidence=0.25),
                                  lambda head: EagleTreeDrafter(head, TreeConfig(budget=6, branching=2, depth=2, min_score=0.0))],
                         ids=["chain", "chain-with-stop", "tree"])
def test_sampled_eagle_runs_follow_the_targets_law_with_a_smaller_vocabulary(make):
    """Chi-square on the first two tokens (the first round drafts up to two) of a 6-token target; the head knows 4 of them."""
    target = tiny_lm(3, 6)
    drafter = make(_head(target, DraftVocab(torch.tensor([0, 2, 3, 5]), 6), seed=1))
    sampling = SamplingConfig("sample", temperature=2.0)
    draws = 1000
    # the runs advance together through the batched executor (each run's answers are its own: tests/test_serve.py)
    gens, _, _ = run_together([speculative_program(target, drafter, TOK, [1, 2, 4], GenerationConfig(
        max_new_tokens=3, gamma=2, stop_at_eos=False, sampling=SamplingConfig("sample", temperature=2.0, seed=seed),
        trace_top_n=1)) for seed in range(draws)], target)
    counts = Counter(tuple(g.tokens[:2]) for g in gens)
    drafted = sum(len(r.draft_ids) for g in gens for r in g.rounds if r.position < 2)  # the rounds that settled the first two
    pvalue, bins = chi_square_pvalue(counts, joint_two(target, [1, 2, 4], sampling), draws)
    assert drafted > draws and bins >= 10  # the head drafted in most runs
    if getattr(drafter, "min_confidence", 0.0):  # the stop decided some rounds: drafts of 1 and of 2 tokens both occur
        lengths = Counter(len(r.draft_ids) for g in gens for r in g.rounds if r.draft_ids)
        print(lengths, pvalue)  # -rP
        assert lengths[1] > 50 and lengths[2] > 50, lengths
    assert pvalue > 1e-3, (pvalue, bins)


def test_a_head_trained_on_the_targets_own_words_guesses_it_better_and_keeps_more_guesses(tiny):
    """A random tiny target is hard to guess (its p is wide, and random), so the bar is relative: trained against
    untrained, on continuations never trained on (measured: expected acceptance 0.10 -> 0.23)."""
    tok, target, sequences, vocab = tiny
    held_out = collect(target, sequences[::4], vocab)
    data = collect(target, [s for i, s in enumerate(sequences) if i % 4], vocab)
    head = _head(target, vocab)
    before = expected_acceptance(head, held_out, skip=6)[0]  # the pairs after each prompt
    losses = train(head, data, TrainConfig(steps=400, seed=0))
    after = expected_acceptance(head, held_out, skip=6)[0]
    print(f"held-out expected acceptance {before:.3f} -> {after:.3f}; loss {losses[0]:.2f} -> {losses[-1]:.2f}")  # -rP
    assert sum(losses[-20:]) < 0.75 * sum(losses[:20])
    assert after > before + 0.06

    kept = {}
    for name, drafter in (("untrained", EagleDrafter(_head(target, vocab))), ("trained", EagleDrafter(head))):
        accepted = drafted = 0
        for seed, prompt in enumerate(PROMPTS):
            ids = tok(prompt)["input_ids"]
            cfg = GenerationConfig(max_new_tokens=40, gamma=4, stop_at_eos=False, sampling=SamplingConfig("sample", seed=seed))
            spec = drain(speculative_generate(target, drafter, tok, ids, cfg))
            accepted += sum(r.n_accepted for r in spec.rounds)
            drafted += sum(len(r.draft_ids) for r in spec.rounds)
        kept[name] = accepted / drafted
    assert kept["trained"] > kept["untrained"] + 0.03, kept


def test_training_is_seeded_the_same_seed_gives_the_same_head(tiny):
    _, target, sequences, vocab = tiny
    data = collect(target, sequences[:8], vocab)
    heads = [_head(target, vocab) for _ in range(2)]
    runs = [train(h, data, TrainConfig(steps=20, seed=5)) for h in heads]
    assert runs[0] == runs[1]
    assert all(torch.equal(a, b) for a, b in zip(heads[0].weights().values(), heads[1].weights().values()))


def test_a_head_for_another_vocabulary_is_refused(tiny):
    tok, target, _, _ = tiny
    head = _head(target, DraftVocab(torch.tensor([1, 2, 3]), 300))
    with pytest.raises(ValueError, match="vocabulary of 300, the target has 257"):
        drain(speculative_generate(target, EagleDrafter(head), tok, tok("hi")["input_ids"], GenerationConfig(max_new_tokens=4)))


def test_the_training_time_test_sees_what_a_drafting_chain_sees(tiny):
    """Pass j of the unrolled training equals the chain's j-th draft step at every pair: the real pairs up to where the
    chain began in the head's cache, then each guessed feature fed forward with the text's next token."""
    _, target, sequences, vocab = tiny
    data = collect(target, sequences[:1], vocab)
    head = _head(target, vocab, seed=2)
    ids, f = data.ids[0], data.feats[0]
    depth, n = 3, 20
    with torch.inference_mode():
        passes = unrolled_guesses(head, data, 0, 0, n + 2, depth)
        for start in range(n - depth + 1):  # the chain begins at pair `start` (its first guess reads a real feature)
            cache = head.new_cache()
            guessed = head(f[: start + 1].float(), ids[1: start + 2], torch.arange(start + 1), cache)[-1:]
            for j in range(depth):
                assert torch.allclose(passes[j][start + j], guessed[0], atol=1e-5), (start, j)
                t = start + j + 1
                guessed = head(guessed, ids[t + 1: t + 2], torch.tensor([t]), cache)


def test_the_training_time_test_trains_and_its_later_guesses_improve(tiny):
    """Unrolled to depth 3, training lowers the loss and lifts the chain's third guess on text never trained on."""
    _, target, sequences, vocab = tiny
    held_out = collect(target, sequences[::8], vocab)
    data = collect(target, [s for i, s in enumerate(sequences) if i % 8][:48], vocab)
    head = _head(target, vocab)
    before = acceptance_by_depth(head, held_out, 3, skip=6)
    losses = train(head, data, TrainConfig(steps=120, seed=0, unroll=3))
    after = acceptance_by_depth(head, held_out, 3, skip=6)
    print("by depth", before, "->", after)  # -rP
    assert sum(losses[-10:]) < sum(losses[:10])
    assert after[2][0] > before[2][0] + 0.03
