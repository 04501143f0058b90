"""A draft whose vocabulary is smaller than the target's: q is 0 outside it, and the rule stays exact (enumerated and sampled)."""

import pytest
import torch

from specviz.core.draft_vocab import DraftVocab, most_frequent
from specviz.core.sampling import SamplingConfig, logits_to_probs, verify_draft
from tests.test_sampling import DRAWS, GAMMA, V, _emitted_by_position, _real_rule, _toy_rows, _worst_pvalue, exact_first_token_dist

SAMPLE = SamplingConfig("sample")
SMALL = DraftVocab(torch.tensor([1, 2, 5, 6]), V)  # half of the toy vocabulary; the target's favourites lie outside too


def _small_logits(seed: int, rows: int) -> torch.Tensor:
    return 1.5 * torch.randn(rows, SMALL.n, generator=torch.Generator().manual_seed(seed))  # (rows, N)


def test_q_is_the_draft_distribution_over_its_ids_and_zero_elsewhere():
    logits = _small_logits(0, 3)
    q = SMALL.q(logits, SAMPLE)  # (3, V)
    assert q.shape == (3, V) and torch.allclose(q.sum(-1), torch.ones(3))
    outside = [i for i in range(V) if i not in SMALL.ids.tolist()]
    assert torch.equal(q[:, outside], torch.zeros(3, len(outside)))
    assert torch.equal(q[:, SMALL.ids], logits_to_probs(logits, SAMPLE))
    greedy = SMALL.q(logits, SamplingConfig("greedy"))
    assert torch.equal(greedy.argmax(-1), SMALL.ids[logits.argmax(-1)]) and torch.equal(greedy.sum(-1), torch.ones(3))


@pytest.mark.parametrize("seed", range(6))
def test_the_first_token_follows_the_target_exactly_when_the_draft_knows_fewer_tokens(seed):
    p = _toy_rows(seed, 2, 1.5)  # (2, V): every token has mass, those outside the draft's ids too
    q = SMALL.q(_small_logits(seed + 50, 1), SAMPLE)  # (1, V)
    assert torch.allclose(exact_first_token_dist(p, q), p[0].double(), atol=1e-6)


def test_a_token_only_the_target_knows_comes_from_the_residual_with_all_its_mass():
    p = torch.tensor([[0.0, 0.2, 0.0, 0.0, 0.0, 0.1, 0.0, 0.7], [1 / V] * V])  # 7 is the target's favourite, not the draft's
    q = SMALL.q(torch.tensor([[0.0, 0.0, 3.0, 0.0]]), SAMPLE)
    v = verify_draft(p, q, torch.tensor([int(q[0].argmax())]), torch.Generator().manual_seed(0))
    assert v.residual[7] > 0.7  # renormalised: 0.7 of the rejected mass and more
    assert torch.allclose(exact_first_token_dist(p, q)[7], torch.tensor(0.7, dtype=torch.float64))


@pytest.mark.parametrize("seed", [21, 22])
def test_sampled_chains_from_a_smaller_vocabulary_follow_the_target(seed):
    p = _toy_rows(seed, GAMMA + 1, 1.5)
    q = SMALL.q(_small_logits(seed + 100, GAMMA), SAMPLE)  # (γ, V)
    counts = _emitted_by_position(_real_rule, p, q, seed)
    assert counts.sum() >= DRAWS
    assert counts[0, [0, 3, 4, 7]].sum() > 0  # tokens outside the draft's ids were emitted (from the residual)
    assert _worst_pvalue(counts, p) > 1e-3 / (GAMMA + 1)  # 4 positions: Bonferroni at 1e-3 overall


def test_greedy_keeps_the_targets_token_when_the_draft_cannot_propose_it():
    p = logits_to_probs(torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0], [0.0] * V]), SamplingConfig("greedy"))
    q = SMALL.q(torch.tensor([[4.0, 1.0, 0.0, 0.0]]), SamplingConfig("greedy"))  # the draft's best: id 1
    v = verify_draft(p, q, torch.tensor([1]), torch.Generator().manual_seed(0))
    assert v.n_accepted == 0 and v.next_token == 7 and v.next_origin == "correction"


def test_most_frequent_keeps_the_top_counts_ties_to_the_smaller_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    assert most_frequent(counts, 3).ids.tolist() == [0, 2, 5]
    assert most_frequent(counts, 4).ids.tolist() == [0, 2, 3, 5]
    assert most_frequent(counts, 8).n == 8
    with pytest.raises(ValueError, match="between 1 and 8"):
        most_frequent(counts, 9)
    with pytest.raises(ValueError, match="ascending, unique"):
        DraftVocab(torch.tensor([3, 1]), 8)
    with pytest.raises(ValueError, match="ascending, unique"):
        DraftVocab(torch.tensor([1, 8]), 8)


def _residual_inside_the_draft_vocab(p, q, draft, gen):
    """A wrong rule: after a rejection it resamples only among the draft's own ids (the target's other tokens lost)."""
    v = verify_draft(p, q, draft, gen)
    if v.next_origin != "correction":
        return v.n_accepted, v.next_token
    inside = torch.zeros_like(v.residual)
    inside[SMALL.ids] = v.residual[SMALL.ids]
    if inside.sum() == 0:  # all the residual lies outside: even this rule must emit something
        return v.n_accepted, v.next_token
    return v.n_accepted, int(torch.multinomial(inside / inside.sum(), 1, generator=gen))


def test_the_sampled_check_catches_a_residual_that_forgets_the_targets_other_tokens():
    p, q = _toy_rows(21, GAMMA + 1, 1.5), SMALL.q(_small_logits(121, GAMMA), SAMPLE)
    assert _worst_pvalue(_emitted_by_position(_residual_inside_the_draft_vocab, p, q, 21), p) < 1e-6
