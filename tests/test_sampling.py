"""Exact and statistical tests of logits_to_probs and verify_draft (the acceptance rule)."""

import pytest
import torch
from scipy.stats import chisquare

from specviz.core.sampling import SamplingConfig, logits_to_probs, verify_draft
from specviz.core import sampling


def _rejecting_verdict(p, q, x):
    """verify_draft on a one-token draft, reseeded until the draft is rejected (if it can be)."""
    for seed in range(10_000):
        v = verify_draft(p, q, torch.tensor([x]), torch.Generator().manual_seed(seed))
        if v.n_accepted == 0:
            return v
    raise AssertionError("never rejected")


def exact_first_token_dist(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(first emitted token = y), enumerated over every draft token x the draft can propose.

    The accept probability and the residual come from verify_draft itself (the residual by
    finding a seed whose uniform rejects), so this checks the real function, not a copy.
    """
    out = torch.zeros(p.shape[1], dtype=torch.float64)
    for x in range(q.shape[1]):
        if q[0, x] == 0:
            continue
        v = verify_draft(p, q, torch.tensor([x]), torch.Generator().manual_seed(0))
        a = v.accept_probs[0]
        out[x] += q[0, x].double() * a
        if a < 1.0:
            out += q[0, x].double() * (1 - a) * _rejecting_verdict(p, q, x).residual.double()
    return out


def _dist(*xs: float) -> torch.Tensor:
    t = torch.tensor(xs, dtype=torch.float32)
    return t / t.sum()


CASES = {
    "generic": (_dist(0.5, 0.2, 0.2, 0.1), _dist(0.1, 0.4, 0.3, 0.2)),
    "q zero where p is not": (_dist(0.3, 0.3, 0.4, 0.0), _dist(0.0, 0.5, 0.5, 0.0)),
    "p zero where q is not": (_dist(0.0, 0.6, 0.4, 0.0), _dist(0.5, 0.25, 0.25, 0.0)),
    "identical": (_dist(0.25, 0.25, 0.4, 0.1), _dist(0.25, 0.25, 0.4, 0.1)),
    "disjoint supports": (_dist(0.7, 0.3, 0.0, 0.0), _dist(0.0, 0.0, 0.5, 0.5)),
    "greedy one-hot agree": (_dist(0, 1, 0, 0), _dist(0, 1, 0, 0)),
    "greedy one-hot disagree": (_dist(0, 0, 1, 0), _dist(1, 0, 0, 0)),
}


@pytest.mark.parametrize("name", CASES)
def test_first_token_follows_target_exactly(name):
    p0, q0 = CASES[name]
    bonus = _dist(0.1, 0.2, 0.3, 0.4)
    p, q = torch.stack([p0, bonus]), q0[None]  # (2, V), (1, V)
    assert torch.allclose(exact_first_token_dist(p, q), p0.double(), atol=1e-6)


def test_identical_distributions_always_accept():
    p0 = _dist(0.25, 0.25, 0.4, 0.1)
    p, q = torch.stack([p0, p0]), p0[None]
    for x in range(4):
        v = verify_draft(p, q, torch.tensor([x]), torch.Generator().manual_seed(x))
        assert v.accept_probs == (1.0,) and v.n_accepted == 1 and v.next_origin == "bonus"


def test_disjoint_supports_always_reject_and_resample_from_p():
    p0, q0 = CASES["disjoint supports"]
    v = verify_draft(torch.stack([p0, p0]), q0[None], torch.tensor([2]), torch.Generator().manual_seed(0))
    assert v.accept_probs == (0.0,) and v.n_accepted == 0 and v.next_origin == "correction"
    assert torch.allclose(v.residual, p0)


def test_greedy_rule_keeps_agreeing_prefix_then_target_argmax():
    cfg = SamplingConfig("greedy")
    target_logits = torch.tensor([[0.0, 3, 1], [2, 0, 1], [0, 1, 5], [4, 0, 0]])  # argmax 1, 0, 2, 0
    p = logits_to_probs(target_logits, cfg)  # one-hot rows
    q = logits_to_probs(torch.tensor([[0.0, 9, 1], [9, 0, 1], [9, 1, 0]]), cfg)  # drafts 1, 0, 0
    v = verify_draft(p, q, torch.tensor([1, 0, 0]), torch.Generator().manual_seed(1))
    assert v.n_accepted == 2 and v.next_token == 2 and v.next_origin == "correction"
    assert v.accept_probs == (1.0, 1.0, 0.0)
    v_all = verify_draft(p, logits_to_probs(target_logits[:3], cfg), torch.tensor([1, 0, 2]), torch.Generator())
    assert v_all.n_accepted == 3 and v_all.next_token == 0 and v_all.next_origin == "bonus"


def test_records_one_uniform_per_drafted_token():
    p = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(3)), -1)
    q = torch.softmax(torch.randn(3, 6, generator=torch.Generator().manual_seed(4)), -1)
    v = verify_draft(p, q, torch.tensor([0, 1, 2]), torch.Generator().manual_seed(5))
    assert len(v.uniforms) == 3 and len(v.accept_probs) == 3
    accepted = [u < a for u, a in zip(v.uniforms, v.accept_probs)]
    expected_n = accepted.index(False) if False in accepted else 3
    assert v.n_accepted == expected_n


def test_logits_to_probs_filters():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.equal(logits_to_probs(logits, SamplingConfig("greedy"))[0], torch.tensor([1.0, 0, 0, 0, 0]))
    topk = logits_to_probs(logits, SamplingConfig("sample", top_k=2))[0]
    assert (topk[2:] == 0).all() and torch.isclose(topk.sum(), torch.tensor(1.0))
    full = torch.softmax(logits[0], -1)
    # top-p 0.8: the first two carry 0.91 of the mass; the second is needed to reach 0.8
    topp = logits_to_probs(logits, SamplingConfig("sample", top_p=0.8))[0]
    assert (topp[2:] == 0).all() and torch.allclose(topp[:2], full[:2] / full[:2].sum())
    hot = logits_to_probs(logits, SamplingConfig("sample", temperature=0.5))[0]
    assert torch.allclose(hot, torch.softmax(logits[0] / 0.5, -1))


@pytest.mark.parametrize(
    "kwargs", [dict(mode="sample", temperature=0), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1), dict(mode="beam")]
)
def test_sampling_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)


# ---- statistical: the emitted tokens follow p at every position (vLLM rejection-sampler style)

V, GAMMA, DRAWS = 8, 3, 12_000


def _toy_rows(seed: int, rows: int, sharp: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(rows, V, generator=g), dim=-1)


def _emitted_by_position(rule, p, q, seed):
    """Run a rule DRAWS times on context-free rows; count emitted tokens per position."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(GAMMA + 1, V)
    for _ in range(DRAWS):
        draft = torch.multinomial(q, 1, generator=gen)[:, 0]  # (γ,) one token from each q row
        n, nxt = rule(p, q, draft, gen)
        for i in range(n):
            counts[i, draft[i]] += 1
        counts[n, nxt] += 1
    return counts


def _real_rule(p, q, draft, gen):
    v = verify_draft(p, q, draft, gen)
    return v.n_accepted, v.next_token


def _lossy_rule(p, q, draft, gen):
    """A tempting shortcut: accept whenever the target ranks the token in its top 3."""
    for i, x in enumerate(draft.tolist()):
        if x not in torch.topk(p[i], 3).indices.tolist():
            return i, int(torch.multinomial(p[i], 1, generator=gen))
    return len(draft), int(torch.multinomial(p[-1], 1, generator=gen))


def _worst_pvalue(counts, p):
    pvals = []
    for i in range(GAMMA + 1):
        n = counts[i].sum()
        expected = (p[i] * n).double()
        keep = expected > 5  # chi-square needs enough expected counts per cell
        obs, exp = counts[i].double()[keep], expected[keep]
        pvals.append(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)
    return min(pvals)


@pytest.mark.parametrize("seed", [11, 12])
def test_sampled_output_follows_target_distribution(seed):
    p, q = _toy_rows(seed, GAMMA + 1, 1.5), _toy_rows(seed + 100, GAMMA, 1.5)
    counts = _emitted_by_position(_real_rule, p, q, seed)
    # 4 positions tested: Bonferroni at an overall 1e-3 false-alarm rate
    assert _worst_pvalue(counts, p) > 1e-3 / (GAMMA + 1)


def test_statistical_test_catches_a_lossy_rule():
    p, q = _toy_rows(11, GAMMA + 1, 1.5), _toy_rows(111, GAMMA, 1.5)
    counts = _emitted_by_position(_lossy_rule, p, q, 11)
    assert _worst_pvalue(counts, p) < 1e-6


def test_greedy_rule_is_deterministic_whatever_the_seed():
    cfg = SamplingConfig("greedy")
    p = logits_to_probs(torch.randn(4, V, generator=torch.Generator().manual_seed(0)), cfg)
    q = logits_to_probs(torch.randn(3, V, generator=torch.Generator().manual_seed(1)), cfg)
    draft = q.argmax(-1)
    outcomes = {
        (v.n_accepted, v.next_token)
        for v in (verify_draft(p, q, draft, torch.Generator().manual_seed(s)) for s in range(50))
    }
    assert len(outcomes) == 1


def test_bonus_token_is_drawn_from_the_position_after_the_draft():
    p = torch.stack([_dist(0.5, 0.3, 0.2), _dist(0.1, 0.6, 0.3)])
    q = _dist(0.2, 0.2, 0.6)[None]
    v = verify_draft(p, q, torch.tensor([0]), torch.Generator().manual_seed(0))  # p/q >= 1: accepted
    assert v.n_accepted == 1 and v.next_origin == "bonus" and torch.allclose(v.residual, p[1])


def _top_p_by_full_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition, over the whole sorted row: drop a token once the mass ranked above it reaches top_p.

    The masses are the whole row's softmax, as the filter's: a softmax of the sorted row sums its denominator in
    another order, and on flat rows (thousands of tokens summed) that last bit moved one boundary token at top-p 0.9."""
    order = torch.sort(logits, dim=-1, descending=True).indices
    mass = torch.softmax(logits, dim=-1).gather(-1, order)
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, (mass.cumsum(-1) - mass) >= top_p)
    return logits.masked_fill(drop, float("-inf"))


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.95, 0.999])
def test_top_p_keeps_the_set_a_full_sort_keeps(top_p: float) -> None:
    """The filter ranks only its leading candidates and widens them until the set is found: it keeps the same tokens as
    a sort of the whole 151,936-token row, on peaked rows, on flat ones (thousands of tokens needed: the widening runs to
    the full row), and on rows top-k already cut (-inf logits)."""
    gen = torch.Generator().manual_seed(1)
    vocab = 151_936
    peaked = torch.randn(4, vocab, generator=gen) * 4
    flat = torch.randn(2, vocab, generator=gen) * 0.05
    cut = torch.randn(1, vocab, generator=gen)
    cut[0, 1000:] = float("-inf")
    for logits in (peaked, flat, cut, torch.cat([peaked[:1], flat[:1]])):
        ours = sampling._top_p_filter(logits, top_p)
        ref = _top_p_by_full_sort(logits, top_p)
        assert torch.equal(ours.isinf(), ref.isinf()), (top_p, int((ours.isinf() != ref.isinf()).sum()))
        kept = (~ours.isinf()).sum(-1)
        assert (kept >= 1).all()
    if top_p >= 0.9:
        assert (~sampling._top_p_filter(flat, top_p).isinf()).sum(-1).min() > sampling._TOP_P_FIRST * 16  # widened far


def test_a_draw_follows_its_weights_exactly_and_never_lands_on_a_zero():
    """sample_from inverts the float64 cumulative sum with one uniform: 40,000 draws from unnormalised weights with
    zeros among them (a residual's shape, and the first and last ids' edge cases) fit the weights, and never land on
    a zero; the same seed gives the same draws."""
    from specviz.core.sampling import sample_from

    weights = torch.tensor([0.0, 3.0, 0.0, 0.0, 1.0, 0.5, 0.0, 2.5, 0.0]) / 7 * 0.98  # sums to a little under 1
    gen = torch.Generator().manual_seed(0)
    draws = [sample_from(weights, gen) for _ in range(40_000)]
    counts = torch.bincount(torch.tensor(draws), minlength=len(weights))
    assert counts[weights == 0].sum() == 0
    support = weights > 0
    w = weights.double()
    expected = w[support] / w[support].sum() * len(draws)
    assert chisquare(counts[support].double().numpy(), expected.double().numpy()).pvalue > 1e-3
    again = torch.Generator().manual_seed(0)
    assert [sample_from(weights, again) for _ in range(50)] == draws[:50]
    assert sample_from(torch.tensor([0.0, 0.0, 1.0]), gen) == 2  # one-hot: its id, no draw
    assert {sample_from(torch.tensor([0.7, 0.0, 0.0, 0.3]), gen) for _ in range(200)} == {0, 3}  # both ends reached
