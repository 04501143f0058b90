"""The bench's records and rows: one timed run (RunRecord), and the repeats of a method aggregated into a BenchRow."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from specviz.core import metrics
from specviz.bench.methods import BASELINE, LLAMA_PLAIN, METHODS_BY_NAME, WORKLOADS_BY_NAME


@dataclass(frozen=True)
class RunRecord:
    """One timed run of one method (a repeat); the aggregation turns these into BenchRows."""

    pair: str
    workload: str
    mode: str
    method: str
    repeat: int
    tokens: tuple[int, ...]  # new ids (EOS included when it stopped the run)
    ms_per_token: float  # (prefill + decode) / new tokens, the same definition for every method
    # ours with a drafter: fields of metrics.compare(this run, the same repeat's target-only run)
    acceptance_rate: float | None = None  # accepted ÷ drafted
    alpha_checked: float | None = None  # Leviathan's α: accepted ÷ checked
    tokens_per_target_call: float | None = None  # ours only (1.0 for the baseline)
    c: float | None = None  # median per-token draft ms ÷ the same repeat's target step
    expected_speedup_measured_verify: float | None = None  # Leviathan with this repeat's measured verify cost
    gamma: float | None = None  # effective γ: configured, or mean drafted per drafting round
    peak_rss_mb: float | None = None  # VmHWM during this run (None where /proc is missing)
    acceptance_by_position: tuple[float, ...] = ()  # share of drafting rounds accepting their k-th token, k = 1…
    gpu_expected: float | None = None  # this run's rounds replayed at the H200's measured costs (specviz.bench.gpu)


@dataclass(frozen=True)
class BenchRow:
    """One line of the table: medians over the repeats, speed-up against the baseline of the same run."""

    pair: str
    workload: str
    kind: str  # predictable / creative
    mode: str
    method: str
    family: str  # ours / hf / llama
    repeats: int
    new_tokens: float  # median new tokens per run
    ms_per_token: float  # median of (prefill + decode) / new tokens
    ms_per_token_min: float
    ms_per_token_max: float
    tokens_per_s: float  # 1000 / median ms per token
    speedup: float | None  # median ms/token of target-only (ours) / median ms/token of this method
    acceptance_rate: float | None  # median accepted ÷ drafted over the repeats (ours with a drafter)
    alpha_checked: float | None  # median Leviathan's α (accepted ÷ checked)
    tokens_per_target_call: float | None  # median (ours)
    c: float | None  # median measured c: median draft ms per token / target ms per step (same repeat)
    expected_speedup: float | None  # Leviathan: from the median alpha_checked, γ and c (verify = 1 step)
    expected_speedup_measured_verify: float | None  # median over repeats: with the measured verify cost
    gamma: float | None  # configured γ, or the median mean drafted per drafting round
    peak_rss_mb: float | None  # the highest VmHWM over the repeats
    identical_to_baseline: bool | None  # greedy: every repeat's tokens == ours target-only tokens
    identical_to_hf_plain: bool | None  # greedy, hf-* rows: every repeat's tokens == hf-plain's
    # per drafted position k = 1…: the median over repeats of the share of drafting rounds that accepted
    # their k-th token (a repeat that never drafted that deep counts 0 there); empty without a drafter
    acceptance_by_position: tuple[float, ...] = ()
    gpu_expected: float | None = None  # median over repeats: the run's rounds at the H200's measured costs
    # greedy, llama.cpp's speculative rows: every repeat's text == llama.cpp's own plain text (read back into ids)
    identical_to_llama_plain: bool | None = None


CSV_COLUMNS = tuple(f.name for f in fields(BenchRow))


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _median_by_position(records: Sequence[RunRecord]) -> tuple[float, ...]:
    """Per position, the median over the repeats of acceptance_by_position (missing positions count 0)."""
    depth = max((len(r.acceptance_by_position) for r in records), default=0)
    return tuple(statistics.median(r.acceptance_by_position[k] if k < len(r.acceptance_by_position) else 0.0
                                   for r in records) for k in range(depth))


def _all_equal(records: Sequence[RunRecord], reference: dict[int, RunRecord]) -> bool | None:
    """True when every repeat's tokens equal the reference run of the same repeat (None: nothing to compare)."""
    pairs = [(r, reference[r.repeat]) for r in records if r.repeat in reference]
    if not pairs:
        return None
    return all(r.tokens == ref.tokens for r, ref in pairs)


def method_order(name: str) -> int:
    names = list(METHODS_BY_NAME)
    return names.index(name) if name in names else len(names)


def aggregate(records: Sequence[RunRecord]) -> list[BenchRow]:
    """Group the runs by (pair, workload, mode, method); medians, speed-ups and identity checks."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.pair, r.workload, r.mode), []).append(r)
    rows: list[BenchRow] = []
    for (pair, workload, mode), recs in groups.items():
        by_method: dict[str, list[RunRecord]] = {}
        for r in recs:
            by_method.setdefault(r.method, []).append(r)
        base = {r.repeat: r for r in by_method.get(BASELINE, [])}
        plain = {name: {r.repeat: r for r in by_method.get(name, [])} for name in ("hf-plain", LLAMA_PLAIN)}
        base_ms = _median(r.ms_per_token for r in base.values())
        for method in sorted(by_method, key=method_order):
            rows.append(_row(pair, workload, mode, method, by_method[method], base, plain, base_ms))
    return rows


def _row(pair: str, workload: str, mode: str, method: str, recs: list[RunRecord], base: dict[int, RunRecord],
         plain: dict[str, dict[int, RunRecord]], base_ms: float | None) -> BenchRow:
    spec = METHODS_BY_NAME.get(method)
    wl = WORKLOADS_BY_NAME.get(workload)
    ms = statistics.median(r.ms_per_token for r in recs)
    alpha, c, gamma = _median(r.alpha_checked for r in recs), _median(r.c for r in recs), _median(r.gamma for r in recs)
    chain = spec is None or spec.drafter is None or metrics.chain_formula_applies(spec.drafter)
    expected = metrics.expected_speedup(alpha, gamma, c) if chain and None not in (alpha, gamma, c) and gamma > 0 else None
    greedy = mode == "greedy"
    is_hf = spec.family == "hf" if spec else method.startswith("hf-")
    is_llama = spec.family == "llama" if spec else method.startswith(LLAMA_PLAIN)
    rss = [r.peak_rss_mb for r in recs if r.peak_rss_mb is not None]
    return BenchRow(
        pair=pair, workload=workload, kind=wl.kind if wl else "", mode=mode, method=method,
        family=spec.family if spec else ("hf" if is_hf else "llama" if is_llama else "ours"),
        repeats=len(recs),
        new_tokens=statistics.median(len(r.tokens) for r in recs),
        ms_per_token=ms,
        ms_per_token_min=min(r.ms_per_token for r in recs),
        ms_per_token_max=max(r.ms_per_token for r in recs),
        tokens_per_s=1000.0 / ms if ms > 0 else float("inf"),
        speedup=base_ms / ms if base_ms is not None and ms > 0 else None,
        acceptance_rate=_median(r.acceptance_rate for r in recs),
        alpha_checked=alpha,
        tokens_per_target_call=_median(r.tokens_per_target_call for r in recs),
        c=c,
        expected_speedup=expected,
        expected_speedup_measured_verify=_median(r.expected_speedup_measured_verify for r in recs),
        gamma=gamma,
        peak_rss_mb=max(rss) if rss else None,
        identical_to_baseline=_all_equal(recs, base) if greedy and method != BASELINE else None,
        identical_to_hf_plain=_all_equal(recs, plain["hf-plain"]) if greedy and is_hf and method != "hf-plain" else None,
        acceptance_by_position=_median_by_position(recs),
        gpu_expected=_median(r.gpu_expected for r in recs),
        identical_to_llama_plain=(_all_equal(recs, plain[LLAMA_PLAIN]) if greedy and is_llama and method != LLAMA_PLAIN
                                  else None),
    )


