"""Acceptance, tokens per target call, measured c, and Leviathan's expected speed-up."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specviz.core.trace import Generation, RoundTrace


def acceptance_rate(rounds: Sequence[RoundTrace]) -> float | None:
    """Accepted / drafted tokens (None while nothing was drafted)."""
    drafted = sum(len(r.draft_ids) for r in rounds)
    return sum(r.n_accepted for r in rounds) / drafted if drafted else None


def tokens_per_target_call(rounds: Sequence[RoundTrace]) -> float | None:
    """New tokens per target forward pass (1.0 for plain decoding)."""
    return sum(len(r.new_ids) for r in rounds) / len(rounds) if rounds else None


def draft_ms_per_token(rounds: Sequence[RoundTrace]) -> float | None:
    """Drafting time per drafted token."""
    drafted = sum(len(r.draft_ids) for r in rounds)
    return sum(r.draft_ms for r in rounds) / drafted if drafted else None


def mean_draft_length(rounds: Sequence[RoundTrace]) -> float | None:
    """Tokens drafted per drafting round: the γ actually used when drafts vary (adaptive, n-gram)."""
    drafted = [len(r.draft_ids) for r in rounds if r.draft_ids]
    return sum(drafted) / len(drafted) if drafted else None


def checked_acceptance(rounds: Sequence[RoundTrace]) -> float | None:
    """α per checked position: accepted / (accepted + first rejections), the α of Leviathan's formula.

    acceptance_rate counts the drafted tokens after a rejection as misses although nobody checked
    them, so it falls as γ grows even when the draft is just as good; this estimate does not.
    """
    accepted = sum(r.n_accepted for r in rounds)
    checked = accepted + sum(1 for r in rounds if r.n_accepted < len(r.draft_ids))
    return accepted / checked if checked else None


def target_ms_per_step(baseline: Generation) -> float | None:
    """One target forward of one new token, from a target-only run (median: robust to hiccups)."""
    steps = [r.verify_ms for r in baseline.rounds]
    return statistics.median(steps) if steps else None


def measured_c(rounds: Sequence[RoundTrace], target_step_ms: float | None) -> float | None:
    """c = draft ms per token / target ms per step (Leviathan's cost ratio, measured)."""
    per_token = draft_ms_per_token(rounds)
    if per_token is None or not target_step_ms:
        return None
    return per_token / target_step_ms


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    """(1 - α^(γ+1)) / (1 - α): the accepted prefix plus the target's own token, on average."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: float, c: float) -> float:
    """(1 - α^(γ+1)) / ((1 - α)(γc + 1)): walltime gain if a verify pass costs one target step."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1.0)


def expected_speedup_at_cost(alpha: float, gamma: float, c: float, verify_cost: float) -> float:
    """E[tokens per round] / (verify_cost + γc): Leviathan's speed-up when a verify pass costs `verify_cost` steps.

    `expected_speedup` is the case verify_cost = 1; a measured verify cost (a CPU, or a busy batch) lowers it.
    """
    return expected_tokens_per_round(alpha, gamma) / (verify_cost + gamma * c)


def best_gamma(alpha: float, c: float, gammas: Sequence[int] = tuple(range(1, 17))) -> int:
    """The γ with the highest expected speed-up."""
    return max(gammas, key=lambda g: expected_speedup(alpha, g, c))


def measured_speedup(baseline: Generation, speculative: Generation) -> float | None:
    """Baseline ms per token / speculative ms per token (same prompt and settings)."""
    if not speculative.tokens or not baseline.tokens or speculative.ms_per_token <= 0:
        return None
    return baseline.ms_per_token / speculative.ms_per_token


@dataclass(frozen=True)
class Summary:
    """The figures a page or the CLI shows for one speculative run (None = not measurable yet)."""

    acceptance_rate: float | None
    tokens_per_target_call: float | None
    ms_per_token: float
    gamma: float  # the configured γ, or the mean drafted per drafting round when adaptive
    c: float | None = None
    expected_speedup: float | None = None
    speedup: float | None = None
    baseline_ms_per_token: float | None = None


def summarize(spec: Generation, baseline: Generation | None = None) -> Summary:
    """All figures of a run, with the baseline-derived ones when a baseline is given."""
    alpha = acceptance_rate(spec.rounds)
    gamma: float = spec.config.gamma
    if spec.config.adaptive or spec.drafter == "ngram":
        gamma = mean_draft_length(spec.rounds) or 0.0
    if baseline is None:
        return Summary(alpha, tokens_per_target_call(spec.rounds), spec.ms_per_token, gamma)
    c = measured_c(spec.rounds, target_ms_per_step(baseline))
    expected = expected_speedup(alpha, gamma, c) if alpha is not None and c is not None and gamma else None
    return Summary(
        alpha, tokens_per_target_call(spec.rounds), spec.ms_per_token, gamma,
        c, expected, measured_speedup(baseline, spec), baseline.ms_per_token,
    )
