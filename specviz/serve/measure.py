"""Batched decoding measured: for each batch size B, B different prompts run together as target-only and as speculative runs, side by side in one process.

What `python -m specviz batch` prints. Tokens per second count every run's new tokens over the
wall time of the whole batch. `identical` compares every batched run with the same run made
alone (same prompt, settings and seed, through the one-run path): the executor's promise.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specviz.bench.loadtest import CLASS_PRESETS, session_prompt
from specviz.core.drafters import make_drafter
from specviz.core.engine import autoregressive_generate, autoregressive_program, solo_run, speculative_program
from specviz.core.metrics import acceptance_drafted, tokens_per_target_call
from specviz.core.progress import drain
from specviz.core.trace import Generation, GenerationConfig
from specviz.presets import PRESETS
from specviz.serve.batch import MAX_RUNS, run_together
from specviz.serve.exact import MAX_ROWS, batch_exactness

SIZES = (1, 4, 8)


@dataclass(frozen=True)
class BatchConfig:
    """One batch measurement: the sizes, the run length and the draft length (greedy, the default chain drafter)."""

    sizes: tuple[int, ...] = SIZES
    max_new_tokens: int = 32
    gamma: int = 4

    def __post_init__(self) -> None:
        if not self.sizes or any(not 1 <= b <= MAX_RUNS for b in self.sizes):
            raise ValueError(f"batch sizes must be 1..{MAX_RUNS}, got {self.sizes}")
        if not 1 <= self.max_new_tokens <= 256:
            raise ValueError(f"max_new_tokens must be 1..256, got {self.max_new_tokens}")


@dataclass(frozen=True)
class SizeResult:
    """One batch size: both kinds of runs, B prompts together."""

    batch: int
    plain_tokens_per_s: float  # every run's new tokens ÷ the batch's wall time, target alone
    spec_tokens_per_s: float  # the same, speculative
    speedup: float  # spec ÷ plain tokens per second at this B
    identical: bool  # every batched run (both kinds) equals the same run alone
    alpha: float | None  # accepted ÷ drafted over the speculative runs
    tokens_per_target_call: float | None
    plain_wall_s: float
    spec_wall_s: float
    runs_per_target_pass: float  # mean runs sharing a target forward (speculative runs)


@dataclass(frozen=True)
class BatchReport:
    pair: str
    max_new_tokens: int
    gamma: int
    exact: bool  # the target's passes were shared (else one run per forward, and `note` says why)
    note: str
    sizes: tuple[SizeResult, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_prompts(n: int) -> list[str]:
    """n different prompts: the presets first (the class's ones leading), then the load test's own."""
    leading = [p.prompt for name in CLASS_PRESETS for p in PRESETS if p.id == name]
    rest = [p.prompt for p in PRESETS if p.prompt not in leading]
    found = list(dict.fromkeys(leading + rest))
    i = 0
    while len(found) < n:
        found.append(session_prompt(i))
        i += 1
    return found[:n]


def _same(a: Generation, b: Generation) -> bool:
    return a.tokens == b.tokens


def measure_batches(pair: Any, pair_name: str, config: BatchConfig,
                    say: Callable[[str], None] = lambda _: None) -> BatchReport:
    """Run every size twice (target alone, speculative) and check each run against itself alone."""
    exactness = batch_exactness(pair.target, MAX_ROWS)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, gamma=config.gamma)
    plain_cfg = GenerationConfig(max_new_tokens=config.max_new_tokens, gamma=1)
    prompts = batch_prompts(max(config.sizes))
    ids = [pair.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    drafter = make_drafter("model", pair.draft)

    def plain(i: int) -> Any:
        return autoregressive_program(pair.target, pair.tokenizer, ids[i], plain_cfg, pair.eos_ids)

    def spec(i: int) -> Any:
        return speculative_program(pair.target, drafter, pair.tokenizer, ids[i], gen, pair.eos_ids)

    say("warming up")
    drain(autoregressive_generate(pair.target, pair.tokenizer, ids[0][:8], GenerationConfig(max_new_tokens=3), pair.eos_ids))
    alone: dict[tuple[str, int], Generation] = {}

    def reference(kind: str, i: int) -> Generation:
        if (kind, i) not in alone:
            say(f"{kind} run {i + 1} alone (the reference)")
            alone[kind, i] = drain(solo_run(plain(i) if kind == "plain" else spec(i)))
        return alone[kind, i]

    rows = []
    for b in config.sizes:
        say(f"batch {b}: target alone")
        p_gens, _, p_wall = run_together([plain(i) for i in range(b)], pair.target)
        say(f"batch {b}: speculative")
        s_gens, s_share, s_wall = run_together([spec(i) for i in range(b)], pair.target)
        same = all(_same(g, reference("plain", i)) for i, g in enumerate(p_gens)) and all(
            _same(g, reference("spec", i)) for i, g in enumerate(s_gens))
        rounds = [r for g in s_gens for r in g.rounds]
        p_rate = sum(len(g.tokens) for g in p_gens) / p_wall
        s_rate = sum(len(g.tokens) for g in s_gens) / s_wall
        rows.append(SizeResult(
            batch=b, plain_tokens_per_s=round(p_rate, 3), spec_tokens_per_s=round(s_rate, 3),
            speedup=round(s_rate / p_rate, 3), identical=same,
            alpha=_r(acceptance_drafted(rounds)), tokens_per_target_call=_r(tokens_per_target_call(rounds)),
            plain_wall_s=round(p_wall, 2), spec_wall_s=round(s_wall, 2),
            runs_per_target_pass=round(statistics.fmean(s.mean for s in s_share), 2),
        ))
    return BatchReport(pair_name, config.max_new_tokens, config.gamma, exactness.exact, exactness.reason, tuple(rows))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def sizes_table(report: BatchReport) -> str:
    """The report as a small text table."""
    lines = [f"{report.pair}, {report.max_new_tokens} tokens a run, γ = {report.gamma}, greedy; "
             f"{'shared target passes' if report.exact else 'one run per target forward'}: {report.note}",
             "batch   plain tok/s   spec tok/s   speed-up   α      tokens/call   runs/pass   identical"]
    for s in report.sizes:
        lines.append(f"{s.batch:>5}   {s.plain_tokens_per_s:>11.2f}   {s.spec_tokens_per_s:>10.2f}   {s.speedup:>8.2f}"
                     f"   {s.alpha if s.alpha is not None else '-':<5}  {s.tokens_per_target_call or '-':>11}"
                     f"   {s.runs_per_target_pass:>9}   {s.identical}")
    return "\n".join(lines)


def relative(report: BatchReport, sizes: Sequence[int] = ()) -> dict[int, tuple[float, float]]:
    """Tokens per second at each size as a multiple of batch 1's (plain, spec), where batch 1 was measured."""
    base = next((s for s in report.sizes if s.batch == 1), None)
    if base is None:
        return {}
    return {s.batch: (s.plain_tokens_per_s / base.plain_tokens_per_s, s.spec_tokens_per_s / base.spec_tokens_per_s)
            for s in report.sizes if not sizes or s.batch in sizes}
