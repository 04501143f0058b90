"""Is speculative decoding lossless? Greedy token identity, and a goodness-of-fit test of sampled continuations."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from scipy.stats import chi2 as chi2_dist
from scipy.stats import chisquare

from specviz.settings import Settings, bounded
from specviz.core import divergence
from specviz.core.divergence import first_divergence
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.rounds import Drafter, TokenTexts, solo
from specviz.core.limits import DEFAULT_GAMMA, GAMMA_RANGE
from specviz.core.trace import GenerationConfig
from specviz.core.limits import SAMPLE_TOKENS_RANGE, SAMPLES_RANGE, check_samples
from specviz.core.progress import Progress, drain, with_progress
from specviz.core.sampling import RuleName, SamplingConfig, acceptance_rule
from specviz.models.precision import batch_variant_twin
from specviz.models import drafting
from specviz.labs.memo import (  # noqa: F401  (the lab's names: pages and tests read them from here)
    MEMO_BYTES, MemoTarget, PrefixMemo, draft_memo, memo_drafter, sampling_drafter, target_memo,
)

RULE_TITLES: dict[str, str] = {
    "exact": "exact rule: accept with min(1, p/q), correct from the residual",
    "topk": "wrong rule: accept whenever the target ranks the guess in its top k, correct from p",
}
TOP_K_RANGE = (1, 10)  # the wrong rule's k: beyond 10 the shortcut barely differs from "accept everything"
MIN_EXPECTED = 5.0  # chi-square bins need this many expected draws; rarer sequences pool into "other"
MAX_BINS = 400  # enough for 5000 draws at 5 expected each (the test stays valid, the enumeration bounded)


# ------------------------------------------------------------------------------------------
# Greedy: the same tokens, one by one
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedyComparison:
    """A speculative and a target-only greedy run of one prompt, token by token."""

    spec_tokens: tuple[int, ...]
    plain_tokens: tuple[int, ...]
    spec_texts: tuple[str, ...]  # one decoded string per token (model text: escape before HTML)
    plain_texts: tuple[str, ...]
    spec_text: str  # the whole decoded continuation of each run
    plain_text: str
    drafter: str
    gamma: int
    target_calls_spec: int  # target passes of the speculative run
    target_calls_plain: int
    drafted: int
    accepted: int
    spec_ms: float  # decode wall time, this machine
    plain_ms: float
    gap: divergence.Divergence | None = None  # the target's own top-2 gap where the runs part (None: identical)
    batch_variant: bool = False  # both runs used the int8 twin of the target (the same-arithmetic lesson)

    @property
    def identical(self) -> bool:
        return self.spec_tokens == self.plain_tokens

    @property
    def first_divergence(self) -> int | None:
        """0-based position of the first differing token (a length difference counts), or None."""
        d = first_divergence(self.spec_tokens, self.plain_tokens)
        return d.position if d else None

    @property
    def n_compared(self) -> int:
        return max(len(self.spec_tokens), len(self.plain_tokens))

    @property
    def n_same(self) -> int:
        """Positions where both runs have the same token."""
        return sum(a == b for a, b in zip(self.spec_tokens, self.plain_tokens))


def greedy_comparison(
    target: torch.nn.Module, drafter: Drafter, tokenizer: Any, prompt_ids: Sequence[int], config: GenerationConfig,
    eos_ids: Sequence[int] = (), batch_variant: bool = False,
) -> Generator[Progress, None, GreedyComparison]:
    """Run the real engine twice (speculative, then target alone) in greedy mode; yield progress as tokens appear.

    Where the runs part, one more target pass measures the target's own top-2 gap there.
    """
    if not config.sampling.greedy:
        raise ValueError("the token-by-token comparison needs greedy decoding")
    total = 2 * config.max_new_tokens
    spec_steps = speculative_generate(target, drafter, tokenizer, prompt_ids, config, eos_ids)
    spec = yield from with_progress(spec_steps, 0, total, "speculative run", config.max_new_tokens)
    plain_steps = autoregressive_generate(target, tokenizer, prompt_ids, config, eos_ids)
    plain = yield from with_progress(plain_steps, config.max_new_tokens, total, "target alone", config.max_new_tokens)
    texts = TokenTexts(tokenizer)
    return GreedyComparison(
        spec_tokens=spec.tokens, plain_tokens=plain.tokens, spec_texts=texts(spec.tokens), plain_texts=texts(plain.tokens),
        spec_text=spec.text, plain_text=plain.text,
        drafter=spec.drafter, gamma=config.gamma, target_calls_spec=spec.target_calls,
        target_calls_plain=plain.target_calls, drafted=spec.drafted, accepted=spec.accepted,
        spec_ms=spec.decode_ms, plain_ms=plain.decode_ms,
        gap=divergence.divergence_with_gap(target, prompt_ids, spec.tokens, plain.tokens), batch_variant=batch_variant,
    )


def greedy_config(s: Settings) -> GenerationConfig:
    """The greedy part's engine config: the sidebar's γ, adaptivity and length, always greedy decoding."""
    return GenerationConfig(max_new_tokens=s.max_new_tokens, gamma=s.gamma, adaptive=s.adaptive,
                            sampling=SamplingConfig("greedy"))


def greedy_job(pair: Any, prompt_ids: Sequence[int], drafter: str, config: GenerationConfig,
               batch_variant: bool = False) -> Generator[Progress, None, GreedyComparison]:
    """The page's greedy job on a loaded pair, with the named drafter; `batch_variant` runs both on the target's int8 twin."""
    target = pair.target
    if batch_variant:
        yield Progress(0, 2 * config.max_new_tokens, "making the target's int8 twin (first time only)…")
        target = batch_variant_twin(pair.target)
    made = drafting.resolve(drafter, pair, adaptive=config.adaptive)
    return (yield from greedy_comparison(target, made, pair.tokenizer, list(prompt_ids), config, pair.eos_ids,
                                         batch_variant))


# ------------------------------------------------------------------------------------------
# Sampling: exact law, samples with and without speculation, and the test
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleConfig:
    """What one sampling test draws; frozen, so it is part of the jobs' keys."""

    sampling: SamplingConfig  # mode "sample": temperature and top-p of p and q; seed = master seed
    n_samples: int = 1000  # N continuations drawn per method
    n_tokens: int = 2  # each sample is the next 1..3 tokens

    def __post_init__(self) -> None:
        if self.sampling.greedy:
            raise ValueError("the distribution test needs sampling (temperature > 0), not greedy decoding")
        check_samples(self.n_samples, self.n_tokens)


@dataclass(frozen=True)
class SpecConfig:
    """How the speculative samples are made (the rule is the lesson's toggle)."""

    gamma: int = DEFAULT_GAMMA  # draft length; a sample only ever needs min(γ, tokens) of it
    drafter: str = drafters.DEFAULT  # a name in the drafter registry
    rule: RuleName = "exact"
    top_k: int = 3  # only for the "topk" rule

    def __post_init__(self) -> None:
        lo, hi = GAMMA_RANGE
        if not lo <= self.gamma <= hi:
            raise ValueError(f"gamma must be in {lo}..{hi}, got {self.gamma}")
        if self.rule == "topk" and not TOP_K_RANGE[0] <= self.top_k <= TOP_K_RANGE[1]:
            raise ValueError(f"k must be in {TOP_K_RANGE[0]}..{TOP_K_RANGE[1]}, got {self.top_k}")
        if self.rule != "exact" and (reason := lossy_rule_unsuited(self.drafter)):
            raise ValueError(reason)


@dataclass(frozen=True)
class ExactLaw:
    """The target's exact probability of every continuation likely enough to be its own chi-square bin."""

    sequences: tuple[tuple[int, ...], ...]  # most likely first
    texts: tuple[tuple[str, ...], ...]  # the tokens of each sequence, decoded one by one
    probs: tuple[float, ...]  # product of the target's processed conditionals p(t1) p(t2|t1) …
    n_samples: int  # the N the bins were sized for (P >= MIN_EXPECTED / N)
    forwards: int  # target passes the enumeration needed (memo misses)

    @property
    def covered(self) -> float:
        return float(sum(self.probs))


@dataclass(frozen=True)
class SampleCounts:
    """N sampled continuations of one method, counted."""

    method: str  # "target" or "speculative"
    rule: str  # "exact", "topk" (or "none" for the target alone)
    counts: tuple[tuple[tuple[int, ...], int], ...]  # (sequence, count), most frequent first
    n: int
    seconds: float  # wall time of the sampling, this machine
    drafted: int  # speculative only: guesses made and accepted over all samples
    accepted: int
    forwards: int  # model passes actually run (memo misses), target + draft
    lookups: int  # rows asked for in all, hits included

    def count(self, seq: tuple[int, ...]) -> int:
        return dict(self.counts).get(seq, 0)


@dataclass(frozen=True)
class Reference:
    """Job one: the exact law and the target-only samples (the same for every rule and γ)."""

    law: ExactLaw
    target: SampleCounts


@dataclass(frozen=True)
class FitTest:
    """Chi-square goodness of fit of one sample set against the exact law, and the total variation."""

    chi2: float
    dof: int
    pvalue: float
    log10_p: float  # the p-value's exponent, still finite where the p-value itself underflows to 0
    tv: float  # ½ Σ |observed share − exact probability| over the same bins
    n_bins: int  # bins used, "other" included


def sample_seeds(master: int, stream: int, n: int) -> list[int]:
    """Per-sample seeds from the master seed; stream 0 = target alone, 1 = speculative (independent draws)."""
    gen = torch.Generator().manual_seed(master * 2 + stream)
    return torch.randint(0, 2**31 - 1, (n,), generator=gen).tolist()


def exact_law(memo: PrefixMemo, tokenizer: Any, prompt_ids: Sequence[int], cfg: SampleConfig,
              ) -> Generator[Progress, None, ExactLaw]:
    """Enumerate every continuation with N·P >= MIN_EXPECTED, expanding prefixes above that bar (P only shrinks)."""
    threshold = MIN_EXPECTED / cfg.n_samples
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    misses0 = memo.misses
    for depth in range(cfg.n_tokens):
        grown: list[tuple[tuple[int, ...], float]] = []
        for i, (prefix, prob) in enumerate(frontier):
            p = solo(memo.probs(list(prompt_ids) + list(prefix), 1))[0].double()  # (V,) the target's processed p
            keep = (p * prob >= threshold).nonzero().flatten().tolist()
            grown += [(prefix + (t,), prob * float(p[t])) for t in keep]
            yield Progress(i + 1, len(frontier), f"exact probabilities, token {depth + 1}: {i + 1}/{len(frontier)} prefixes")
        frontier = sorted(grown, key=lambda sp: -sp[1])[:MAX_BINS]
    texts = TokenTexts(tokenizer)
    return ExactLaw(
        sequences=tuple(s for s, _ in frontier), texts=tuple(texts(s) for s, _ in frontier),
        probs=tuple(pr for _, pr in frontier), n_samples=cfg.n_samples, forwards=memo.misses - misses0,
    )


def _counted(method: str, rule: str, seqs: list[tuple[int, ...]], seconds: float, drafted: int, accepted: int,
             memos: Sequence[PrefixMemo]) -> SampleCounts:
    ranked = sorted(Counter(seqs).items(), key=lambda kv: (-kv[1], kv[0]))
    return SampleCounts(
        method=method, rule=rule, counts=tuple(ranked), n=len(seqs), seconds=seconds, drafted=drafted,
        accepted=accepted, forwards=sum(m.misses for m in memos), lookups=sum(m.misses + m.hits for m in memos),
    )


def _every(n: int) -> int:
    return max(1, n // 100)  # about 100 progress updates per job


def reference_job(target: torch.nn.Module, tokenizer: Any, prompt_ids: Sequence[int], cfg: SampleConfig,
                  ) -> Generator[Progress, None, Reference]:
    """Exact law, then N target-only samples through the real engine (autoregressive_generate)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    memo = target_memo(target, cfg.sampling)
    law = yield from exact_law(memo, tokenizer, prompt_ids, cfg)
    t0, seqs = time.perf_counter(), []
    for i, seed in enumerate(sample_seeds(cfg.sampling.seed, 0, cfg.n_samples)):
        gc = GenerationConfig(max_new_tokens=cfg.n_tokens, gamma=1, sampling=replace(cfg.sampling, seed=seed),
                              trace_top_n=1, stop_at_eos=False)
        g = drain(autoregressive_generate(target, tokenizer, prompt_ids, gc, (), target_probs=MemoTarget(memo)))
        seqs.append(g.tokens[: cfg.n_tokens])
        if (i + 1) % _every(cfg.n_samples) == 0:
            yield Progress(i + 1, cfg.n_samples, f"target alone: {i + 1}/{cfg.n_samples} samples")
    return Reference(law, _counted("target", "none", seqs, time.perf_counter() - t0, 0, 0, [memo]))


def speculative_job(target: torch.nn.Module, draft: torch.nn.Module | None, tokenizer: Any, prompt_ids: Sequence[int],
                    cfg: SampleConfig, spec: SpecConfig, head: Any = None) -> Generator[Progress, None, SampleCounts]:
    """N speculative samples through the real engine with the chosen rule; the first n_tokens of each are kept.

    The engine never drafts past its budget (the last token is always the target's own), so a
    one-token sample runs with a budget of two tokens and keeps the first: otherwise nothing
    would be drafted and the rule never tested. The kept tokens' law is the target's either way.
    """
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    vocab = target.config.vocab_size
    memo = target_memo(target, cfg.sampling)
    drafter = sampling_drafter(spec.drafter, draft, target, cfg.sampling, vocab, head)
    memos = [memo] + [m for m in (getattr(drafter, "q_memo", None),) if isinstance(m, PrefixMemo)]
    rule = acceptance_rule(spec.rule, spec.top_k)
    target_probs = MemoTarget(memo)  # p and, for a drafter that reads them, the target's features, per prefix
    t0, seqs, drafted, accepted = time.perf_counter(), [], 0, 0
    for i, seed in enumerate(sample_seeds(cfg.sampling.seed, 1, cfg.n_samples)):
        gc = GenerationConfig(max_new_tokens=max(2, cfg.n_tokens), gamma=spec.gamma, sampling=replace(cfg.sampling, seed=seed),
                              trace_top_n=1, stop_at_eos=False)
        g = drain(speculative_generate(target, drafter, tokenizer, prompt_ids, gc, (), accept_rule=rule, target_probs=target_probs))
        seqs.append(g.tokens[: cfg.n_tokens])
        drafted += g.drafted
        accepted += g.accepted
        if (i + 1) % _every(cfg.n_samples) == 0:
            yield Progress(i + 1, cfg.n_samples, f"with speculation: {i + 1}/{cfg.n_samples} samples")
    return _counted("speculative", spec.rule, seqs, time.perf_counter() - t0, drafted, accepted, memos)


def binned(law: ExactLaw, counts: SampleCounts) -> tuple[list[float], list[float]]:
    """Observed and expected counts per bin: every sequence of the law, then "other" (merged if too small)."""
    n = counts.n
    observed = [float(counts.count(s)) for s in law.sequences]
    expected = [n * pr for pr in law.probs]
    other_obs = n - sum(observed)
    other_exp = max(0.0, n - sum(expected))
    if other_exp >= MIN_EXPECTED or not observed:
        observed.append(other_obs)
        expected.append(other_exp)
    else:  # too rare to test alone: pool "other" into the least likely bin
        observed[-1] += other_obs
        expected[-1] += other_exp
    return observed, expected


def fit_test(law: ExactLaw, counts: SampleCounts) -> FitTest:
    """Pearson's chi-square of the samples against the exact probabilities, plus the total-variation distance."""
    observed, expected = binned(law, counts)
    n = counts.n
    tv = 0.5 * sum(abs(o - e) for o, e in zip(observed, expected)) / n
    if len(observed) < 2:  # one bin holds everything: nothing to test, nothing can deviate
        return FitTest(0.0, 0, 1.0, 0.0, tv, len(observed))
    res = chisquare(observed, [e * n / sum(expected) for e in expected])  # rescaled so both sums match exactly
    dof = len(observed) - 1
    return FitTest(float(res.statistic), dof, float(res.pvalue), _log10_sf(float(res.statistic), dof), tv, len(observed))


def sample_config(s: Settings, n_samples: int, n_tokens: int) -> SampleConfig:
    """The sampling test the page asks for: the sidebar's temperature, top-p and seed (even while it is on greedy)."""
    sampling = SamplingConfig("sample", temperature=s.temperature, top_p=s.top_p, seed=s.seed)
    # the widgets' ranges, held again here whatever the browser sent
    return SampleConfig(sampling, n_samples=bounded(n_samples, *SAMPLES_RANGE, SAMPLES_RANGE[0]),
                        n_tokens=bounded(n_tokens, *SAMPLE_TOKENS_RANGE, SAMPLE_TOKENS_RANGE[0]))


def lossy_rule_unsuited(drafter: str) -> str | None:
    """Why the lossy rule cannot be tried with this drafter (None: it can), in words the page shows by its toggle."""
    kind = drafters.spec(drafter)
    if kind.shape == "chain":
        return None
    return (f"The wrong rule is a rule for a chain of guesses. The {kind.title} is checked by its own walk down the "
            f"tree, which is always the exact one here, so this switch is off. Choose a chain drafter in the sidebar "
            f"to watch a lossy rule get caught.")


def spec_config(s: Settings, wrong: bool, top_k: int) -> SpecConfig:
    """The speculative samples the page asks for: the sidebar's γ and drafter, the exact rule or the lossy one
    (the exact one where the drafter's rounds have no other: `lossy_rule_unsuited`)."""
    wrong = wrong and lossy_rule_unsuited(s.drafter) is None
    k = bounded(top_k, *TOP_K_RANGE, TOP_K_RANGE[0]) if wrong else 0
    return SpecConfig(gamma=s.gamma, drafter=s.drafter, rule="topk" if wrong else "exact", top_k=k)


@dataclass(frozen=True)
class SamplingTest:
    """What the page shows of a finished sampling test: both fits and the histogram's rows."""

    fit_target: FitTest  # the target-only samples against the exact law: the sampling-noise floor
    fit_spec: FitTest  # the speculative samples against the exact law: the test of the rule
    rows: tuple[HistogramRow, ...]


def judge(ref: Reference, spec: SampleCounts) -> SamplingTest:
    """Test both sample sets against the exact law and bin them for the histogram."""
    return SamplingTest(fit_test(ref.law, ref.target), fit_test(ref.law, spec), histogram_rows(ref.law, ref.target, spec))


@dataclass(frozen=True)
class SamplingRecord:
    """What the page offers for download after a sampling test: the exact law, both sample sets and both fits."""

    law: ExactLaw
    target: SampleCounts
    speculative: SampleCounts
    fit_target: FitTest
    fit_spec: FitTest
    rule: str
    top_k: int


def sampling_record(ref: Reference, spec: SampleCounts, test: SamplingTest, spec_cfg: SpecConfig) -> SamplingRecord:
    return SamplingRecord(ref.law, ref.target, spec, test.fit_target, test.fit_spec, spec_cfg.rule, spec_cfg.top_k)


class Pace:
    """Seconds per sample on this server, the last test's (both methods, run one after the other by the one model
    worker), per pair, drafter and sample length: how long another sample count will take is said from it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, int], tuple[float, int]] = {}

    def note(self, pair: str, drafter: str, n_tokens: int, ref: Reference, spec: SampleCounts) -> None:
        if spec.n > 0:
            with self._lock:
                self._seen[(pair, drafter, n_tokens)] = ((ref.target.seconds + spec.seconds) / spec.n, spec.n)

    def estimate(self, pair: str, drafter: str, n_tokens: int, n_samples: int) -> tuple[float, int] | None:
        """(seconds for n_samples of both methods, the sample count it was timed at), or None where never timed."""
        with self._lock:
            found = self._seen.get((pair, drafter, n_tokens))
        return (found[0] * n_samples, found[1]) if found else None


PACE = Pace()  # one per server, like its jobs


def _log10_sf(stat: float, dof: int) -> float:
    """log10 of the chi-square tail P(X >= stat), also where the tail itself underflows to 0.

    Past underflow it uses the leading term of the incomplete gamma's asymptotic series,
    Q(a, x) ≈ x^(a−1) e^(−x) / Γ(a) with a = dof/2, x = stat/2 (accurate when x ≫ a).
    """
    log_sf = float(chi2_dist.logsf(stat, dof))
    if math.isfinite(log_sf):
        return log_sf / math.log(10)
    a, x = dof / 2, stat / 2
    return ((a - 1) * math.log(x) - x - math.lgamma(a)) / math.log(10)


@dataclass(frozen=True)
class HistogramRow:
    """One bar group of the figure: a continuation, its exact probability and both observed shares."""

    tokens: tuple[str, ...]  # decoded one by one; empty for the "other" row
    exact: float
    target_share: float
    spec_share: float

    @property
    def other(self) -> bool:
        return not self.tokens


def histogram_rows(law: ExactLaw, target: SampleCounts, spec: SampleCounts, top: int = 12) -> tuple[HistogramRow, ...]:
    """The `top` likeliest continuations, then everything else pooled as one "other" row."""
    rows = [HistogramRow(t, pr, target.count(s) / target.n, spec.count(s) / spec.n)
            for s, t, pr in list(zip(law.sequences, law.texts, law.probs))[:top]]
    rest = (1.0 - sum(r.exact for r in rows), 1.0 - sum(r.target_share for r in rows), 1.0 - sum(r.spec_share for r in rows))
    if max(rest) > 1e-9:
        rows.append(HistogramRow((), max(0.0, rest[0]), max(0.0, rest[1]), max(0.0, rest[2])))
    return tuple(rows)
