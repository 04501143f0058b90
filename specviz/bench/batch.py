"""Batched decoding measured: for each batch size B, B different prompts run together as target-only and as speculative runs, side by side in one process.

What `python -m specviz batch` prints. Tokens per second count every run's new tokens over the
wall time of the whole batch. `identical` compares every batched run with the same run made
alone (same prompt, settings and seed, through the one-run path): the executor's promise.
`verify_steps` is what one shared verify pass cost at that B, in one-token target steps of a run
alone: the spare compute that makes checking cheap, and how a busy server uses it up. With a
`context`, every prompt is a different window of one long document (the regime where the KV
cache, not the weights, would dominate: MagicDec, 2024).
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specviz.bench.loadtest import CLASS_PRESETS, session_prompt
from specviz.bench.timing import available_bytes, batch_bytes, dims, machine_of, memory_problem, model_device
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, autoregressive_program, speculative_program
from specviz.core.limits import DEFAULT_GAMMA
from specviz.core.rounds import solo_run
from specviz.core.metrics import acceptance_drafted, tokens_per_target_call
from specviz.core.progress import Progress, drain
from specviz.core.trace import Generation, GenerationConfig
from specviz.models import drafting
from specviz.models.weights import model_bytes
from specviz.presets import PRESETS
from specviz.serve.batch import run_together
from specviz.serve.exact import MAX_ROWS, batch_exactness

SIZES = (1, 4, 8)
LARGEST_SIZE = 16  # the largest batch measured: the busy-server lab's B = 1…16 (a size is B runs admitted at once)
CONTEXT_MAX = 4096
DOCUMENT = Path(__file__).resolve().parents[1] / "core"  # the long document: this package's own engine source


@dataclass(frozen=True)
class BatchConfig:
    """One batch measurement: the sizes, the run length and the draft length (greedy, the default chain drafter)."""

    sizes: tuple[int, ...] = SIZES
    max_new_tokens: int = 32
    gamma: int = DEFAULT_GAMMA
    context: int = 0  # tokens per prompt from one long document (0: the presets and the load test's prompts)
    repeats: int = 1  # times each size is measured (the speed-up's range across them is reported)
    time_limit_s: float = 0.0  # stop before a size that would end past this many seconds (0: no limit)

    def __post_init__(self) -> None:
        if not self.sizes or any(not 1 <= b <= LARGEST_SIZE for b in self.sizes):
            raise ValueError(f"batch sizes must be 1..{LARGEST_SIZE}, got {self.sizes}")
        if not 1 <= self.max_new_tokens <= 256:
            raise ValueError(f"max_new_tokens must be 1..256, got {self.max_new_tokens}")
        if not (self.context == 0 or 16 <= self.context <= CONTEXT_MAX):
            raise ValueError(f"context must be 0 or 16..{CONTEXT_MAX} tokens, got {self.context}")
        if not 1 <= self.repeats <= 5:
            raise ValueError(f"repeats must be 1..5, got {self.repeats}")
        if self.time_limit_s < 0:
            raise ValueError(f"time_limit_s must be >= 0, got {self.time_limit_s}")


@dataclass(frozen=True)
class SizeResult:
    """One batch size: both kinds of runs, B prompts together."""

    batch: int
    plain_tokens_per_s: float  # every run's new tokens ÷ the batch's wall time, target alone
    spec_tokens_per_s: float  # the same, speculative
    plain_alone_tokens_per_s: float  # the same B runs one after another (each alone), target alone
    spec_alone_tokens_per_s: float  # ...and speculative: what batching is measured against
    speedup: float  # spec ÷ plain tokens per second at this B (the median over repeats)
    speedup_range: tuple[float, float]  # lowest and highest over the repeats
    identical: bool  # every batched run (both kinds) equals the same run alone
    alpha: float | None  # accepted ÷ drafted over the speculative runs
    tokens_per_target_call: float | None
    plain_wall_s: float
    spec_wall_s: float
    runs_per_target_pass: float  # mean runs sharing a target forward (speculative runs)
    verify_steps: float | None  # a shared verify pass at this B ÷ a one-token step of a run alone (medians)


@dataclass(frozen=True)
class BatchReport:
    pair: str
    max_new_tokens: int
    gamma: int
    context: int  # tokens per prompt (0: short prompts)
    exact: bool  # the target's passes were shared (else one run per forward, and `note` says why)
    note: str
    sizes: tuple[SizeResult, ...]
    machine: str = ""  # where it was measured: "cpu: <name>, N threads" or "cuda: <GPU name>"
    stopped: str | None = None  # why the largest sizes asked for were not measured (memory, the time limit)
    kv_bytes_per_token: int = 0  # the target's KV cache per token of one run (all layers, keys and values)
    weight_bytes: int = 0  # the target's weights: what every step reads whatever the batch
    date: str = ""  # the day it was measured (ISO), so that a shipped recording says when

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def declines(self) -> bool:
        """Whether the speed-up at the largest batch is clearly below batch 1's (beyond both ranges)."""
        first, last = self.sizes[0], self.sizes[-1]
        return len(self.sizes) > 1 and last.speedup_range[1] < first.speedup_range[0]


def report_from_dict(d: Mapping[str, Any]) -> BatchReport:
    """A report read back from `python -m specviz batch --json` (a shipped recording); KeyError/TypeError when it is not one."""
    names = {f.name for f in fields(SizeResult)}
    sizes = tuple(SizeResult(**{k: (tuple(v) if k == "speedup_range" else v) for k, v in row.items() if k in names})
                  for row in d["sizes"])
    if not sizes:
        raise ValueError("a batch recording without sizes")
    top = {f.name for f in fields(BatchReport)} - {"sizes"}
    return BatchReport(**{k: v for k, v in d.items() if k in top}, sizes=sizes)


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


def document_prompts(tokenizer: Any, n: int, tokens: int) -> list[list[int]]:
    """n different windows of `tokens` ids each from one long document (this package's engine source, read in a fixed order)."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCUMENT.glob("*.py")))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < tokens + n:
        raise ValueError(f"the document has {len(ids)} tokens: too few for {n} windows of {tokens}")
    step = max(1, (len(ids) - tokens) // max(1, n))
    return [ids[i * step : i * step + tokens] for i in range(n)]


def _same(a: Generation, b: Generation) -> bool:
    return a.tokens == b.tokens


def measure_batches(pair: Any, pair_name: str, config: BatchConfig,
                    say: Callable[[str], None] = lambda _: None) -> BatchReport:
    """Run every size twice (target alone, speculative) and check each run against itself alone (the command line's way)."""
    return drain(batch_steps(pair, pair_name, config), lambda p: say(p.message))



def _size_estimate(b: int, last: tuple[int, int | float], alone_s: list[float], timed: int) -> float:
    """Seconds a batch size `b` would take: its runs alone not timed yet (2b in all, `timed` done) at the mean of those
    that were, and its runs together at most in proportion to the last size's (a shared pass costs less than its rows
    one by one). Scaling the whole last size by b instead stopped the lab's 1, 4, 16 before 16 in the app, though
    they take 47.6 s drained directly: most of a size is its runs alone, which the last size had partly done."""
    last_b, last_together_s = last
    mean_alone = sum(alone_s) / len(alone_s) if alone_s else 0.0
    return max(0, 2 * b - timed) * mean_alone + last_together_s * b / last_b

Available = Callable[[Any], int]  # free bytes where a batch would live, for a device


def batch_steps(pair: Any, pair_name: str, config: BatchConfig, available: Available | None = None,
                clock: Callable[[], float] = time.perf_counter) -> Generator[Progress, None, BatchReport]:
    """The measurement as a job: yields Progress (runs done, time left) and returns the report.

    Sizes are measured smallest first; one that would not fit in free memory, or would end past the
    time limit (estimated from the size before it), is not started, and the report says why.
    """

    free = available or available_bytes
    device = model_device(pair.target)
    exactness = batch_exactness(pair.target, MAX_ROWS)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, gamma=config.gamma)
    plain_cfg = GenerationConfig(max_new_tokens=config.max_new_tokens, gamma=1)
    n = max(config.sizes)
    if config.context:
        ids = document_prompts(pair.tokenizer, n, config.context)
    else:
        ids = [pair.tokenizer(p, add_special_tokens=False)["input_ids"] for p in batch_prompts(n)]
    drafter = drafting.resolve(drafters.DEFAULT, pair)
    total = sum(2 * config.repeats * b for b in config.sizes) + 2 * n  # runs: batched ones, and each run alone once
    done = 0
    start = clock()

    def progress(message: str) -> Progress:
        elapsed = clock() - start
        left = f"; about {elapsed / done * (total - done):.0f} s left" if done else ""
        return Progress(done, total, f"{message}{left}")

    def plain(i: int) -> Any:
        return autoregressive_program(pair.target, pair.tokenizer, ids[i], plain_cfg, pair.eos_ids)

    def spec(i: int) -> Any:
        return speculative_program(pair.target, drafter, pair.tokenizer, ids[i], gen, pair.eos_ids)

    yield progress("warming up")
    drain(autoregressive_generate(pair.target, pair.tokenizer, ids[0][:8], GenerationConfig(max_new_tokens=3), pair.eos_ids))
    alone: dict[tuple[str, int], tuple[Generation, float]] = {}

    def reference(kind: str, i: int) -> Generator[Progress, None, Generation]:
        """The same run alone (timed: the runs one after another are what batching is measured against)."""
        nonlocal done
        if (kind, i) not in alone:
            yield progress(f"{'target alone' if kind == 'plain' else 'speculative'}: run {i + 1} by itself")
            t0 = clock()
            result = drain(solo_run(plain(i) if kind == "plain" else spec(i)))
            alone[kind, i] = result, clock() - t0
            done += 1
        return alone[kind, i][0]

    def alone_rate(kind: str, b: int) -> float:
        runs = [alone[kind, i] for i in range(b)]
        return sum(len(g.tokens) for g, _ in runs) / sum(sec for _, sec in runs)

    rows: list[SizeResult] = []
    stopped: str | None = None
    last: tuple[int, float] | None = None  # (batch, seconds its runs together took: the references alone apart)
    for b in config.sizes:
        longest = max(len(x) for x in ids[:b]) + config.max_new_tokens
        need = batch_bytes(pair.target.config, b, config.gamma + 1, longest) + batch_bytes(pair.draft.config, b, 1, longest)
        stopped = memory_problem(need, free(device), b)
        if stopped is None and config.time_limit_s and last is not None:
            estimate = _size_estimate(b, last, [sec for _, sec in alone.values()], len(alone))
            if clock() - start + estimate > config.time_limit_s:
                stopped = (f"stopped before batch {b}: it would take about {estimate:.0f} s more, past this lab's "
                           f"limit of {config.time_limit_s:.0f} s")
        if stopped:
            break
        for kind in ("plain", "spec"):
            for i in range(b):
                yield from reference(kind, i)
        t_size = clock()
        tries = []
        for k in range(config.repeats):
            again = f" (repeat {k + 1} of {config.repeats})" if config.repeats > 1 else ""
            yield progress(f"batch {b}: {b} runs together, target alone{again}")
            p_gens, _, p_wall = run_together([plain(i) for i in range(b)], pair.target)
            done += b
            yield progress(f"batch {b}: {b} runs together, speculative{again}")
            s_gens, s_share, s_wall = run_together([spec(i) for i in range(b)], pair.target)
            done += b
            tries.append((p_gens, p_wall, s_gens, s_share, s_wall))
        rows.append(_size_result(b, tries, alone, alone_rate))
        last = (b, clock() - t_size)
        yield progress(f"batch {b} measured: speed-up {rows[-1].speedup:.2f}×")
    return BatchReport(pair_name, config.max_new_tokens, config.gamma, config.context, exactness.exact, exactness.reason,
                       tuple(rows), _machine_line(machine_of(device)), stopped, _kv_bytes_per_token(pair.target),
                       model_bytes(pair.target), datetime.date.today().isoformat())


def _kv_bytes_per_token(target: Any) -> int:

    d = dims(target.config)
    return 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * next(target.parameters()).element_size()


def _size_result(b: int, tries: list[tuple], alone: dict[tuple[str, int], tuple[Generation, float]],
                 alone_rate: Callable[[str, int], float]) -> SizeResult:
    """One size's row from its repeats: medians, the speed-up's range, and whether every run equals itself alone."""
    same = all(_same(g, alone["plain", i][0]) for t in tries for i, g in enumerate(t[0])) and all(
        _same(g, alone["spec", i][0]) for t in tries for i, g in enumerate(t[2]))
    rates = [(sum(len(g.tokens) for g in t[0]) / t[1], sum(len(g.tokens) for g in t[2]) / t[4]) for t in tries]
    speedups = sorted(sp / pl for pl, sp in rates)
    p_gens, p_wall, s_gens, s_share, s_wall = tries[len(tries) // 2]
    step_ms = statistics.median(r.verify_ms for r in alone["plain", 0][0].rounds)  # a one-token step, alone
    verify = [r.verify_ms for g in s_gens for r in g.rounds if r.draft_ids]
    rounds = [r for g in s_gens for r in g.rounds]
    return SizeResult(
        batch=b, plain_tokens_per_s=round(statistics.median(r[0] for r in rates), 3),
        spec_tokens_per_s=round(statistics.median(r[1] for r in rates), 3),
        plain_alone_tokens_per_s=round(alone_rate("plain", b), 3), spec_alone_tokens_per_s=round(alone_rate("spec", b), 3),
        speedup=round(statistics.median(speedups), 3), speedup_range=(round(speedups[0], 3), round(speedups[-1], 3)),
        identical=same,
        alpha=_r(acceptance_drafted(rounds)), tokens_per_target_call=_r(tokens_per_target_call(rounds)),
        plain_wall_s=round(p_wall, 2), spec_wall_s=round(s_wall, 2),
        runs_per_target_pass=round(statistics.fmean(s.mean for s in s_share), 2),
        verify_steps=_r(statistics.median(verify) / step_ms) if verify and step_ms else None,
    )


def _machine_line(m: Any) -> str:
    return f"cpu: {m.name}, {m.threads} threads" if m.device == "cpu" else f"{m.device}: {m.name}"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def sizes_table(report: BatchReport) -> str:
    """The report as a small text table."""
    context = f", prompts of {report.context} tokens from one document" if report.context else ""
    lines = [f"{report.pair}, {report.max_new_tokens} tokens a run, γ = {report.gamma}, greedy{context}; "
             f"{'shared target passes' if report.exact else 'one run per target forward'}: {report.note}",
             "tokens/s: batched (the same runs one after another)",
             "batch   plain tok/s       spec tok/s        speed-up (range)       α      tokens/call   verify steps   runs/pass   identical"]
    for s in report.sizes:
        lo, hi = s.speedup_range
        lines.append(f"{s.batch:>5}   {s.plain_tokens_per_s:>6.2f} ({s.plain_alone_tokens_per_s:>5.2f})"
                     f"   {s.spec_tokens_per_s:>6.2f} ({s.spec_alone_tokens_per_s:>5.2f})   {s.speedup:>5.2f}"
                     f" ({lo:.2f}-{hi:.2f})   {s.alpha if s.alpha is not None else '-':<5}  {s.tokens_per_target_call or '-':>11}"
                     f"   {s.verify_steps if s.verify_steps is not None else '-':>12}   {s.runs_per_target_pass:>9}   {s.identical}")
    return "\n".join(lines)
