"""Every figure of a run, and one Comparison record of a speculative run against its target-only baseline.

Two acceptances, never mixed: `acceptance_drafted` = accepted ÷ drafted (what a pupil sees: the
guesses after a rejection count as misses), `alpha_checked` = accepted ÷ checked positions
(Leviathan's α, the only one his formula may be fed). Leviathan's formula lives here once:
`expected_speedup_at_cost`; every curve, page, lab, benchmark row and CLI key reads it or the record.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specviz.core import drafters
from specviz.core.divergence import Divergence, first_divergence
from specviz.core.trace import Generation, RoundTrace


def acceptance_drafted(rounds: Sequence[RoundTrace]) -> float | None:
    """Accepted / drafted tokens (None while nothing was drafted); NOT Leviathan's α, see alpha_checked."""
    drafted = sum(len(r.draft_ids) for r in rounds)
    return sum(r.n_accepted for r in rounds) / drafted if drafted else None


def alpha_checked(rounds: Sequence[RoundTrace]) -> float | None:
    """Leviathan's α: accepted / checked positions (accepted + first rejections).

    acceptance_drafted counts the drafted tokens after a rejection as misses although nobody checked
    them, so it falls as γ grows even when the draft is just as good; this estimate does not.
    """
    accepted = sum(r.n_accepted for r in rounds)
    checked = accepted + sum(1 for r in rounds if r.n_accepted < len(r.draft_ids))
    return accepted / checked if checked else None


def draft_depth(r: RoundTrace) -> int:
    """How many tokens deep a round drafted: a chain's length, a tree's deepest node (0: a target-only step)."""
    if r.tree is not None:
        return max((n.depth for n in r.tree.nodes), default=0)
    return len(r.draft_ids)


def acceptance_by_position(rounds: Sequence[RoundTrace]) -> tuple[float, ...]:
    """For k = 1 … the deepest draft: the share of drafting rounds whose k-th drafted token was accepted.

    Counted as vLLM's per-position counters are (accepted at position k ÷ drafting rounds): a round that drafted
    fewer than k tokens, or stopped before k, is a miss at k; a tree's k-th token is the k-th of its accepted
    path. Hence never rising with k: each position pays only if every one before it was accepted.
    """
    drafting = [r for r in rounds if draft_depth(r) > 0]
    if not drafting:
        return ()
    deepest = max(draft_depth(r) for r in drafting)
    return tuple(sum(1 for r in drafting if r.n_accepted >= k) / len(drafting) for k in range(1, deepest + 1))


def tokens_per_target_call(rounds: Sequence[RoundTrace]) -> float | None:
    """New tokens per target forward pass (1.0 for plain decoding)."""
    return sum(len(r.new_ids) for r in rounds) / len(rounds) if rounds else None


def draft_ms_per_token(rounds: Sequence[RoundTrace]) -> float | None:
    """Median over drafting rounds of draft ms ÷ tokens drafted that round (one cold round cannot inflate it)."""
    costs = [r.draft_ms / len(r.draft_ids) for r in rounds if r.draft_ids]
    return statistics.median(costs) if costs else None


def mean_draft_length(rounds: Sequence[RoundTrace]) -> float | None:
    """Tokens drafted per drafting round: the γ actually used when drafts vary (adaptive, n-gram)."""
    drafted = [len(r.draft_ids) for r in rounds if r.draft_ids]
    return sum(drafted) / len(drafted) if drafted else None


def target_ms_per_step(baseline: Generation) -> float | None:
    """One target forward of one new token, from a target-only run (median: robust to hiccups)."""
    steps = [r.verify_ms for r in baseline.rounds]
    return statistics.median(steps) if steps else None


def measured_c(rounds: Sequence[RoundTrace], target_step_ms: float | None) -> float | None:
    """c = median per-token draft cost ÷ the target step measured in the same run (Leviathan's cost ratio)."""
    per_token = draft_ms_per_token(rounds)
    if per_token is None or not target_step_ms:
        return None
    return per_token / target_step_ms


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    """(1 - α^(γ+1)) / (1 - α): the accepted prefix plus the target's own token, on average."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup_at_cost(alpha: float, gamma: float, c: float, verify_cost: float = 1.0) -> float:
    """Leviathan's speed-up E[tokens per round] / (verify_cost + γc), α = alpha_checked.

    verify_cost is one verify pass in target steps: 1 in the paper; a measured one (a CPU, a busy
    batch) lowers the gain.
    """
    return expected_tokens_per_round(alpha, gamma) / (max(verify_cost, 1e-9) + gamma * c)


def expected_speedup(alpha: float, gamma: float, c: float) -> float:
    """(1 - α^(γ+1)) / ((1 - α)(γc + 1)): the textbook case, a verify pass costs one target step."""
    return expected_speedup_at_cost(alpha, gamma, c, 1.0)


def best_gamma(alpha: float, c: float, gammas: Sequence[int] = tuple(range(1, 17))) -> int:
    """The γ with the highest expected speed-up."""
    return max(gammas, key=lambda g: expected_speedup(alpha, g, c))


def measured_speedup(baseline: Generation, speculative: Generation) -> float | None:
    """Baseline ms per token / speculative ms per token (same prompt and settings)."""
    if not speculative.tokens or not baseline.tokens or speculative.ms_per_token <= 0:
        return None
    return baseline.ms_per_token / speculative.ms_per_token


# ------------------------------------------------------------------------------------------
# The measured verify cost: one pass over n tokens, in target steps
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyFit:
    """A straight line through the measured verify costs: steps(n) = intercept + slope·n, n tokens scored."""

    intercept: float
    slope: float
    max_scored: int  # largest n actually measured (beyond it the line is an extrapolation)

    def steps(self, scored: float) -> float:
        return max(self.intercept + self.slope * scored, 0.0)


def verify_steps_by_size(rounds: Sequence[RoundTrace], step_ms: float) -> dict[int, float]:
    """Median verify ms per pass size (tokens scored = drafted + 1), in target steps."""
    by_size: dict[int, list[float]] = {}
    for r in rounds:
        by_size.setdefault(len(r.draft_ids) + 1, []).append(r.verify_ms)
    return {n: statistics.median(ms) / step_ms for n, ms in sorted(by_size.items())}


def fit_verify_cost(sizes: Mapping[int, float]) -> VerifyFit | None:
    """Least-squares line through one median per pass size (each size weighs the same, however many rounds)."""
    if len(sizes) < 2:
        return None
    n = np.array(list(sizes), dtype=float)
    steps = np.array(list(sizes.values()), dtype=float)
    slope, intercept = np.polyfit(n, steps, 1)
    return VerifyFit(float(intercept), float(slope), int(n.max()))


def verify_fit_of(baseline: Generation, rounds: Sequence[RoundTrace]) -> VerifyFit | None:
    """The fit through the baseline's one-token steps and these rounds' verify passes (same run, same machine)."""
    step = target_ms_per_step(baseline)
    return fit_verify_cost(verify_steps_by_size(list(baseline.rounds) + list(rounds), step)) if step else None


def speedup_with_verify_cost(alpha: float, gamma: float, c: float, fit: VerifyFit) -> float:
    """Leviathan's speed-up with the fitted cost of a (γ+1)-token verify pass in place of 1 target step."""
    return expected_speedup_at_cost(alpha, gamma, c, fit.steps(gamma + 1))


# ------------------------------------------------------------------------------------------
# The one comparison record
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A speculative run against its target-only twin: every figure a page, lab, bench row or CLI shows.

    None = not measurable (no baseline yet, nothing drafted). The baseline fields need `baseline`.
    """

    drafted: int
    accepted: int
    acceptance_drafted: float | None  # accepted ÷ drafted: what the Watch page shows as "acceptance"
    alpha_checked: float | None  # accepted ÷ checked: Leviathan's α, the only α the formulas read
    tokens_per_target_call: float | None
    ms_per_token: float  # the speculative run's decode ms per new token
    gamma: float  # the configured γ, or the mean drafted per drafting round when adaptive / n-gram / tree (nodes)
    baseline_ms_per_token: float | None = None
    target_step_ms: float | None = None  # median one-token step of the baseline
    draft_ms_per_token: float | None = None  # median per-round draft ms ÷ tokens drafted
    c: float | None = None  # draft_ms_per_token ÷ target_step_ms
    speedup: float | None = None  # measured: baseline ms/token ÷ speculative ms/token
    expected_speedup: float | None = None  # textbook Leviathan from alpha_checked, γ, c (verify = 1 step); None for trees
    verify_steps: float | None = None  # measured cost of a (γ+1)-token verify pass (a tree: its nodes + 1), in target steps
    expected_speedup_measured_verify: float | None = None  # Leviathan with verify_steps in place of 1
    identical: bool | None = None  # greedy only: the same tokens as the baseline
    divergence: Divergence | None = None  # greedy only: where they first differ
    acceptance_by_position: tuple[float, ...] = ()  # share of drafting rounds accepting their k-th token, k = 1…

    @property
    def first_divergence(self) -> int | None:
        return self.divergence.position if self.divergence else None


def effective_gamma(spec: Generation) -> float:
    """The configured γ, or the mean drafted per drafting round where drafts vary (adaptive, n-gram, the
    nodes of a tree)."""
    if spec.config.adaptive or (drafters.is_drafter(spec.drafter) and drafters.spec(spec.drafter).length == "variable"):
        return mean_draft_length(spec.rounds) or 0.0
    return float(spec.config.gamma)


def chain_formula_applies(drafter: str) -> bool:
    """Whether Leviathan's formula describes this drafter's rounds (a chain's; a tree's tokens per pass follow other odds)."""
    return drafters.is_drafter(drafter) and drafters.spec(drafter).leviathan


def compare(spec: Generation, baseline: Generation | None = None) -> Comparison:
    """All figures of a speculative run, and the baseline-derived ones when its target-only twin is given."""
    rounds = spec.rounds
    alpha, gamma = alpha_checked(rounds), effective_gamma(spec)
    own = dict(drafted=spec.drafted, accepted=spec.accepted, acceptance_drafted=acceptance_drafted(rounds),
               alpha_checked=alpha, tokens_per_target_call=tokens_per_target_call(rounds),
               ms_per_token=spec.ms_per_token, gamma=gamma, draft_ms_per_token=draft_ms_per_token(rounds),
               acceptance_by_position=acceptance_by_position(rounds))
    if baseline is None:
        return Comparison(**own)
    step = target_ms_per_step(baseline)
    c = measured_c(rounds, step)
    fit = verify_fit_of(baseline, rounds)
    verify = fit.steps(gamma + 1) if fit and gamma else None
    known = alpha is not None and c is not None and gamma > 0 and chain_formula_applies(spec.drafter)
    greedy = spec.config.sampling.greedy
    return Comparison(
        **own, baseline_ms_per_token=baseline.ms_per_token, target_step_ms=step, c=c,
        speedup=measured_speedup(baseline, spec),
        expected_speedup=expected_speedup(alpha, gamma, c) if known else None,  # type: ignore[arg-type]
        verify_steps=verify,
        expected_speedup_measured_verify=(
            expected_speedup_at_cost(alpha, gamma, c, verify) if known and verify is not None else None),  # type: ignore[arg-type]
        identical=(spec.tokens == baseline.tokens) if greedy else None,
        divergence=first_divergence(spec.tokens, baseline.tokens) if greedy else None,
    )
