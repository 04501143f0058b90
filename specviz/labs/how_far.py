"""How far to guess: a γ sweep (target-only baseline + one speculative run per γ) and Leviathan's curves."""

from __future__ import annotations

import statistics
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any


from specviz.settings import Settings
from specviz.core import metrics
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.metrics import VerifyFit, speedup_with_verify_cost, verify_steps_by_size
from specviz.core.limits import GAMMA_RANGE, check_gamma
from specviz.core.trace import Generation, GenerationConfig
from specviz.core.progress import Progress, with_progress
from specviz.core.sampling import SamplingConfig
from specviz.core.limits import APP_MAX_NEW_RANGE
from specviz.labs import ranking
from specviz.models import drafting

DEFAULT_GAMMAS = (1, 2, 4, 8)  # qwen-coder, code preset, twice at 32 tokens: under a minute on the 2-core CPU
GAMMA_CHOICES = tuple(range(GAMMA_RANGE[0], GAMMA_RANGE[1] + 1))
CURVE_GAMMAS = GAMMA_CHOICES  # the chart's x axis: γ = 1..16


@dataclass(frozen=True)
class SweepConfig:
    """One measurement of the lab; frozen and made of plain values, so it is the runner's cache key."""

    pair: str  # model pair name (the runner shares jobs between pupils by this key)
    prompt: str  # raw text the models continue
    drafter: str  # a name in the drafter registry whose rounds γ sizes (the sidebar's drafter; see `unsuited`)
    gammas: tuple[int, ...]  # the draft lengths measured, sorted and unique
    max_new_tokens: int  # per run (EOS may stop a run earlier)
    sampling: SamplingConfig  # the sidebar's decoding: the same for the baseline and every γ
    repeats: int = 1  # rounds of the baseline and every γ, one after another (interleaved, as the bench runs them)

    def __post_init__(self) -> None:
        reason = unsuited(self.drafter)
        if reason:
            raise ValueError(reason)
        if not self.gammas:
            raise ValueError("choose at least one γ to measure")
        for g in self.gammas:
            check_gamma(g)
        if tuple(sorted(set(self.gammas))) != self.gammas:
            raise ValueError(f"γ values must be sorted and unique, got {self.gammas} (use make_sweep_config)")
        if not 1 <= self.max_new_tokens <= APP_MAX_NEW_RANGE[1]:  # the app's bound, held here on the server too
            raise ValueError(f"max new tokens must be in 1..{APP_MAX_NEW_RANGE[1]}, got {self.max_new_tokens}")
        if not 1 <= self.repeats <= 5:
            raise ValueError(f"repeats must be in 1..5, got {self.repeats}")

    def spec_config(self, gamma: int) -> GenerationConfig:
        """Fixed γ, never adaptive: the lab asks what each γ does on its own."""
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=gamma, sampling=self.sampling)

    def baseline_config(self) -> GenerationConfig:
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=GAMMA_RANGE[0], sampling=self.sampling)

    @property
    def runs(self) -> int:
        return (1 + len(self.gammas)) * self.repeats


def unsuited(drafter: str) -> str | None:
    """Why a γ sweep says nothing about this drafter (None: it applies), in words the page shows instead of a chart."""
    kind = drafters.spec(drafter)
    if kind.gamma_applies:
        return None
    return (f"A γ sweep does not apply to the {kind.title}: γ does not set how far it guesses (its size per round is "
            f"its own), so every γ would measure the same run. Choose a chain drafter in the sidebar for this lab; "
            f"the *Chain or tree* lab measures trees by their size.")


def make_sweep_config(pair: str, prompt: str, drafter: str, gammas: Sequence[int], max_new_tokens: int,
                      sampling: SamplingConfig, repeats: int = 1) -> SweepConfig:
    """A SweepConfig with the γ values sorted and de-duplicated (a multiselect gives them in click order)."""
    return SweepConfig(pair, prompt, drafter, tuple(sorted({int(g) for g in gammas})), max_new_tokens, sampling,
                       repeats)


@dataclass(frozen=True)
class GammaPoint:
    """What one speculative run at one γ measured."""

    gamma: int
    acceptance: float | None  # accepted / drafted (as on the Watch page)
    alpha: float | None  # accepted / checked positions (metrics.alpha_checked)
    tokens_per_round: float | None  # new tokens per target pass
    c: float | None  # median draft ms per drafted token / target ms per step
    speedup: float | None  # baseline ms/token ÷ this run's ms/token (decode only)
    ms_per_token: float
    verify_steps: float | None  # median verify pass that scored γ + 1 tokens, in target steps
    new_tokens: int
    identical: bool | None  # greedy only: the same tokens as the baseline
    acceptance_by_position: tuple[float, ...] = ()  # share of rounds accepting their k-th guess, k = 1…γ
    speedup_low: float | None = None  # repeated: the lowest and highest speed-up of its repeats (whiskers)
    speedup_high: float | None = None
    repeats: int = 1  # runs at this γ (each against the baseline of its own round)


@dataclass(frozen=True)
class Sweep:
    """The lab's result: the baseline, one point per γ, and the pooled α and c of all runs."""

    config: SweepConfig
    target_step_ms: float | None  # median one-token target step of the baseline
    baseline_ms_per_token: float
    baseline_tokens: int
    alpha: float | None  # pooled over every γ run (checked positions)
    acceptance: float | None  # pooled accepted / drafted
    c: float | None  # pooled
    verify_fit: VerifyFit | None  # None when fewer than two pass sizes were measured
    points: tuple[GammaPoint, ...]

    @property
    def best_measured(self) -> GammaPoint | None:
        scored = [p for p in self.points if p.speedup is not None]
        return max(scored, key=lambda p: p.speedup) if scored else None

    @property
    def timing_spread(self) -> float | None:
        """The largest spread of one γ's speed-ups over its repeats (None with one run each)."""
        return ranking.widest_repeats_spread(self.points)

    @property
    def margin(self) -> float:
        """The lead the fastest γ needs to be called the winner: the repeats' spread, never below the floor."""
        return ranking.margin(self.timing_spread)

    def leaders(self) -> tuple[GammaPoint, ...]:
        """The fastest γ and every γ within the margin of it (several leaders are "about the same", each a right
        prediction)."""
        return ranking.leaders(self.points, lambda p: p.speedup, self.margin)


@dataclass(frozen=True)
class Curves:
    """Leviathan's expected tokens per round and speed-up at every γ of the chart, and the best γ."""

    alpha: float
    c: float
    gammas: tuple[int, ...]
    tokens: tuple[float, ...]
    speedup: tuple[float, ...]
    best: int


def leviathan_curves(alpha: float, c: float, gammas: Sequence[int] = CURVE_GAMMAS) -> Curves:
    """The two curves for one (α, c), from metrics' formulas."""
    return Curves(
        alpha, c, tuple(gammas),
        tuple(metrics.expected_tokens_per_round(alpha, g) for g in gammas),
        tuple(metrics.expected_speedup(alpha, g, c) for g in gammas),
        metrics.best_gamma(alpha, c, gammas),
    )


def best_case_speedup(gamma: float, c: float, verify_steps: float = 1.0) -> float:
    """The speed-up if every guess were accepted, (γ + 1) / (γc + verify): no α can do better."""
    return (gamma + 1) / (gamma * c + verify_steps)


def verify_cost_curve(alpha: float, c: float, fit: VerifyFit, gammas: Sequence[int] = CURVE_GAMMAS) -> tuple[float, ...]:
    """Leviathan's speed-up at every γ with the fitted verify cost in place of one target step."""
    return tuple(speedup_with_verify_cost(alpha, g, c, fit) for g in gammas)


def verify_cost_curves(alpha: float, c: float, fit: VerifyFit, gammas: Sequence[int] = CURVE_GAMMAS) -> Curves:
    """Leviathan's curves with the measured verify cost in place of one step, and the best γ of that curve."""
    speed = verify_cost_curve(alpha, c, fit, gammas)
    best = max(range(len(speed)), key=speed.__getitem__)
    return Curves(alpha, c, tuple(gammas), tuple(metrics.expected_tokens_per_round(alpha, g) for g in gammas),
                  speed, tuple(gammas)[best])


def run_verify_fit(spec: Generation, baseline: Generation) -> VerifyFit | None:
    """The verify-cost line of one speculative run and its target-only baseline (the Watch page's single γ)."""
    return metrics.verify_fit_of(baseline, spec.rounds)


@dataclass(frozen=True)
class RunTradeoff:
    """One speculative run against its baseline on Leviathan's curves (the Watch page's D5 chart)."""

    textbook: Curves  # a verify pass costs one target step
    with_cost: Curves | None  # the measured verify cost in its place (None: fewer than two pass sizes measured)
    gamma: float  # the run's γ (mean drafted per round when adaptive or prompt lookup)
    verify_steps: float | None  # fitted cost of this run's pass over γ + 1 tokens, in target steps
    measured: float | None  # the run's measured speed-up

    def expected(self, with_cost: bool = True) -> float | None:
        """The expected speed-up at this run's γ: with the measured verify cost, or the textbook's one step."""
        if with_cost and (self.with_cost is None or self.verify_steps is None):
            return None
        verify = self.verify_steps if with_cost and self.verify_steps else 1.0
        book = self.textbook
        return metrics.expected_tokens_per_round(book.alpha, self.gamma) / (self.gamma * book.c + verify)


def run_tradeoff(spec: Generation, baseline: Generation) -> RunTradeoff | None:
    """The run's Comparison (α checked, robust c, γ, measured speed-up) on Leviathan's curves; None until measurable
    and for trees (the curves describe a chain of guesses)."""
    cmp = metrics.compare(spec, baseline)
    if cmp.alpha_checked is None or cmp.c is None or not metrics.chain_formula_applies(spec.drafter):
        return None
    gamma = cmp.gamma or float(spec.config.gamma)
    fit = run_verify_fit(spec, baseline)
    return RunTradeoff(
        textbook=leviathan_curves(cmp.alpha_checked, cmp.c),
        with_cost=verify_cost_curves(cmp.alpha_checked, cmp.c, fit) if fit else None,
        gamma=gamma,
        verify_steps=max(fit.steps(gamma + 1), 1e-9) if fit else None,
        measured=cmp.speedup,
    )


def _point(gamma: int, runs: Sequence[tuple[Generation, Generation]], step_ms: float | None) -> GammaPoint:
    """One γ from its repeats, each (its run, the baseline of the same round): the first round's acceptance and tokens
    (every repeat decodes the same tokens: same settings, same seed), the repeats' median speed-up and its range."""
    gen, baseline = runs[0]
    cmp = metrics.compare(gen, baseline)
    each = [s for s in (metrics.compare(g, b).speedup for g, b in runs) if s is not None]
    # rounds cut short by the token budget score fewer tokens: only full (γ+1)-token passes count here
    verify = verify_steps_by_size([r for g, _ in runs for r in g.rounds], step_ms).get(gamma + 1) if step_ms else None
    return GammaPoint(
        gamma=gamma,
        acceptance=cmp.acceptance_drafted,
        alpha=cmp.alpha_checked,
        tokens_per_round=cmp.tokens_per_target_call,
        c=cmp.c,
        speedup=statistics.median(each) if each else None,
        ms_per_token=statistics.median(g.ms_per_token for g, _ in runs),
        verify_steps=verify,
        new_tokens=len(gen.tokens),
        identical=None if cmp.identical is None else all(metrics.compare(g, b).identical for g, b in runs),
        acceptance_by_position=cmp.acceptance_by_position,
        speedup_low=min(each) if each else None,
        speedup_high=max(each) if each else None,
        repeats=len(runs),
    )


Round = tuple[Generation, Sequence[tuple[int, Generation]]]  # one round of a sweep: its baseline, then (γ, run) each


def summarize_sweep(config: SweepConfig, rounds: Sequence[Round]) -> Sweep:
    """Every figure of the lab from the recorded runs (pure: no model). The baseline's figures and the target step
    are the first round's; α, c and the verify cost pool every run."""
    baseline = rounds[0][0]
    step = metrics.target_ms_per_step(baseline)
    passes = [r for _, runs in rounds for _, gen in runs for r in gen.rounds]
    by_gamma = {g: [(gen, base) for base, runs in rounds for gg, gen in runs if gg == g] for g, _ in rounds[0][1]}
    return Sweep(
        config=config,
        target_step_ms=step,
        baseline_ms_per_token=baseline.ms_per_token,
        baseline_tokens=len(baseline.tokens),
        alpha=metrics.alpha_checked(passes),
        acceptance=metrics.acceptance_drafted(passes),
        c=metrics.measured_c(passes, step),
        verify_fit=metrics.verify_fit_of(baseline, passes),
        points=tuple(_point(g, runs, step) for g, runs in by_gamma.items()),
    )


def sweep_steps(pair: Any, prompt_ids: Sequence[int], config: SweepConfig) -> Generator[Progress, None, Sweep]:
    """The runner job: `repeats` rounds, each the baseline and then one speculative run per γ (so a slow spell lands
    on several γ rather than all of one); a Progress per round and after each run."""
    budget, ids, eos = config.max_new_tokens, list(prompt_ids), tuple(pair.eos_ids)
    total, done = budget * config.runs, 0
    rounds: list[Round] = []
    for repeat in range(config.repeats):
        again = f" (round {repeat + 1} of {config.repeats})" if config.repeats > 1 else ""
        yield Progress(done, total, f"target alone (the baseline){again}…")
        baseline = yield from with_progress(
            autoregressive_generate(pair.target, pair.tokenizer, ids, config.baseline_config(), eos),
            done, total, f"target alone{again}", budget)
        done += budget
        runs: list[tuple[int, Generation]] = []
        for gamma in config.gammas:
            yield Progress(done, total, f"{done // budget} of {config.runs} runs done; next γ = {gamma}{again}…")
            drafter = drafting.resolve(config.drafter, pair)
            gen = yield from with_progress(
                speculative_generate(pair.target, drafter, pair.tokenizer, ids, config.spec_config(gamma), eos),
                done, total, f"γ = {gamma}{again}", budget)
            runs.append((gamma, gen))
            done += budget
        rounds.append((baseline, runs))
    yield Progress(total, total, f"all {config.runs} runs done")
    return summarize_sweep(config, rounds)


# ------------------------------------------------------------------------------------------
# What the page asks for (from the sidebar's Settings) and the curves it draws
# ------------------------------------------------------------------------------------------

ALPHA_RANGE = (0.0, 1.0)  # the α slider
C_RANGE = (0.0, 1.5)  # the c slider: c > 1 means the draft is slower per token than the target (never worth it)


PAGE_REPEATS = 2  # the page's sweep: every γ twice, so a winner must lead by more than its own runs' spread
PAGE_TOKENS = 32  # per run of the page's sweep: ten runs of 32 (baseline and four γ, twice) cost what five of 64 did


def sweep_config(s: Settings, prompt: str, gammas: Sequence[int]) -> SweepConfig:
    """The sweep a page asks for: the sidebar's pair, drafter and decoding; the γ values chosen on the page; each run
    at most PAGE_TOKENS new tokens (the sidebar's length where shorter), every γ PAGE_REPEATS times."""
    return make_sweep_config(s.pair, prompt, s.drafter, gammas, min(s.max_new_tokens, PAGE_TOKENS), s.sampling,
                             PAGE_REPEATS)


def measured_curves(sweep: Sweep) -> Curves | None:
    """Leviathan's curves for the sweep's measured α and c (None unless both were measured)."""
    if sweep.alpha is None or sweep.c is None:
        return None
    return leviathan_curves(sweep.alpha, sweep.c)


def expected_at(sweep: Sweep, gamma: int) -> float | None:
    """Leviathan's expected speed-up at one γ with the sweep's measured α and c."""
    if sweep.alpha is None or sweep.c is None:
        return None
    return leviathan_curves(sweep.alpha, sweep.c, (gamma,)).speedup[0]


def verify_curves(sweep: Sweep) -> Curves | None:
    """The curves with the measured verify cost in place of Leviathan's one step (None if not measured)."""
    if sweep.alpha is None or sweep.c is None or sweep.verify_fit is None:
        return None
    return verify_cost_curves(sweep.alpha, sweep.c, sweep.verify_fit)


def main_curves(sweep: Sweep) -> Curves | None:
    """The page's main curve: with the measured verify cost when it was measured, else the textbook one."""
    return verify_curves(sweep) or measured_curves(sweep)


def _slider_value(x: float, lo: float, hi: float) -> float:
    return round(min(max(x, lo), hi), 2)


def slider_start(sweep: Sweep | None) -> tuple[float, float] | None:
    """The measured α and c as the sliders can hold them (clamped, two decimals); None before a measurement."""
    if sweep is None or sweep.alpha is None or sweep.c is None:
        return None
    return _slider_value(sweep.alpha, *ALPHA_RANGE), _slider_value(sweep.c, *C_RANGE)


def slider_curves(sweep: Sweep | None, alpha: float, c: float) -> Curves | None:
    """The sliders' own curves, unless the sliders still sit on the measured α and c (then the measured ones say it)."""
    start = slider_start(sweep)
    if start is not None and abs(alpha - start[0]) <= 0.004 and abs(c - start[1]) <= 0.004:
        return None
    return leviathan_curves(alpha, c)
