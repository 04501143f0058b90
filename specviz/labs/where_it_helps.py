"""Where it helps: speed-up and acceptance per preset workload, run now or read from a `specviz bench` file."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from specviz.core import metrics
from specviz.labs import ranking
from specviz.bench.harness import BASELINE, CSV_COLUMNS, METHODS_BY_NAME
from specviz.bench.report import safe_name
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import Generation, GenerationConfig
from specviz.core.progress import Progress, with_progress
from specviz.presets import PRESETS, Preset, get_preset
from specviz.settings import Settings, encode_prompt, prompt_problem
from specviz.core.limits import APP_MAX_NEW_RANGE
from specviz.models import drafting

Source = Literal["run", "bench"]
BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
# Pairs too slow on a 2-core CPU to run twelve generations while a class waits: the page opens them on a
# recorded benchmark file (the sentence shown names no speed: the visitor's machine decides that).
SLOW_PAIRS = frozenset({"qwen-coder"})
SHORT_TOKENS = 20  # new tokens per run of the default press (see workloads_config)
REPEATS = 2  # each workload's pair of runs, twice: a winner must lead by more than its own runs' spread
NEEDED_COLUMNS = ("workload", "kind", "mode", "method", "speedup", "acceptance_rate")


class BenchReadError(ValueError):
    """A benchmark file that cannot be shown (one line for the page)."""


@dataclass(frozen=True)
class WorkloadRow:
    """One bar of each chart: a workload's speed-up and acceptance (None where not measurable)."""

    workload: str  # preset / benchmark workload id ("code", "story", …)
    title: str
    group: str  # "predictable" or "creative"
    speedup: float | None  # target-only ms/token ÷ speculative ms/token
    acceptance: float | None  # accepted / drafted tokens
    tokens_per_round: float | None  # new tokens per target pass
    ms_per_token: float | None  # speculative
    baseline_ms_per_token: float | None  # target alone
    new_tokens: float | None
    identical: bool | None  # greedy: the speculative text equals the target-only text
    speedup_low: float | None = None  # run now, repeated: the lowest and highest speed-up of its repeats (whiskers)
    speedup_high: float | None = None
    repeats: int = 1  # runs of each kind this row's figures are medians of

    @property
    def repeat_spread(self) -> float | None:
        """How far this workload's repeated speed-ups differed: highest ÷ lowest − 1 (None with one run)."""
        return ranking.repeats_spread(self)


@dataclass(frozen=True)
class WorkloadResults:
    """What the page draws, whichever the source."""

    source: Source
    pair: str
    method: str  # what the bars measure, in words
    rows: tuple[WorkloadRow, ...]
    skipped: tuple[str, ...] = ()  # workloads that could not run (with the reason)
    target_step_ms: float | None = None  # run now: median one-token target step over all baselines

    @property
    def repeated(self) -> bool:
        return any(r.repeats > 1 for r in self.rows)

    @property
    def timing_spread(self) -> float | None:
        """This measurement's noise. Repeated (run now): the largest spread of one workload's speed-ups over its
        interleaved repeats, the same runs timed again. Otherwise (a recording's medians): how far the target-alone
        runs' ms/token differed across workloads, the same model timed on short prompts."""
        if self.repeated:
            return ranking.widest_repeats_spread(self.rows)
        return ranking.spread(r.baseline_ms_per_token for r in self.rows)

    @property
    def margin(self) -> float:
        """The relative lead a workload (or a group) needs to be called the winner of this measurement."""
        return ranking.margin(self.timing_spread)

    def leaders(self) -> tuple[WorkloadRow, ...]:
        """The workload that gained most and every one within the margin of it (several: about the same)."""
        return ranking.leaders(self.rows, lambda r: r.speedup, self.margin)

    def group_mean(self, group: str, field: str) -> float | None:
        """Mean of one field over a group's workloads (None when nothing was measured)."""
        vals = [getattr(r, field) for r in self.rows if r.group == group and getattr(r, field) is not None]
        return sum(vals) / len(vals) if vals else None


# ---------------------------------------------------------------------------------------------
# source 1: run the presets now


@dataclass(frozen=True)
class WorkloadsConfig:
    """One "run now" measurement; frozen and hashable, so it is the runner's cache key."""

    pair: str
    drafter: str  # a name in the drafter registry (the sidebar's drafter)
    spec: GenerationConfig  # the sidebar's speculative settings (γ, adaptive, decoding, max new tokens)
    baseline: GenerationConfig  # the same decoding, target alone
    presets: tuple[Preset, ...] = PRESETS  # the workloads, in display order
    repeats: int = REPEATS  # rounds over every workload, one after another (interleaved, as the bench runs them)

    def __post_init__(self) -> None:
        for cfg in (self.spec, self.baseline):  # the app's bound, held here on the server too
            if cfg.max_new_tokens > APP_MAX_NEW_RANGE[1]:
                raise ValueError(f"max new tokens must be in 1..{APP_MAX_NEW_RANGE[1]}, got {cfg.max_new_tokens}")
        if not 1 <= self.repeats <= 5:
            raise ValueError(f"repeats must be in 1..5, got {self.repeats}")

    @property
    def runs(self) -> int:
        return 2 * len(self.presets) * self.repeats


def workloads_config(s: Settings, full: bool = False) -> WorkloadsConfig:
    """The "run now" measurement the sidebar asks for: its pair, drafter and decoding, speculative and target alone,
    each workload REPEATS times, interleaved.

    Unless `full`, each run stops at SHORT_TOKENS new tokens: twelve runs of the sidebar's 64 took 68 s on the
    2-core test machine (2026-12-07), past the minute a class should wait after a press; twice as many runs of 20
    keep it within the minute and give each workload a spread. Full length is a choice."""
    spec, base = s.generation_config(), s.baseline_config()
    if not full and spec.max_new_tokens > SHORT_TOKENS:
        spec, base = replace(spec, max_new_tokens=SHORT_TOKENS), replace(base, max_new_tokens=SHORT_TOKENS)
    return WorkloadsConfig(s.pair, s.drafter, spec, base)


def default_source(pair: str, bench_found: bool) -> tuple[Source, str]:
    """Which source the page opens on, and one sentence saying why."""
    if pair in SLOW_PAIRS and bench_found:
        return "bench", (f"`{pair}` is this app's largest pair, so the page opens on the latest benchmark file (its "
                         "machine and date are named below); **Run now on this machine** measures this computer.")
    if pair in SLOW_PAIRS:
        return "run", f"`{pair}` is slow on this CPU, but no benchmark file was found for it, so the page runs it here."
    return "run", f"`{pair}` is fast enough on this CPU to run every workload now."


def _row(preset: Preset, runs: Sequence[tuple[Generation, Generation]]) -> WorkloadRow:
    """One workload's bar from its repeats, each (speculative, target alone): medians as the bench takes them (the
    speed-up is the median target-alone ms/token over the median speculative one), and the repeats' own speed-ups as
    its whiskers."""
    cmps = [metrics.compare(spec, base) for spec, base in runs]
    spec_ms = statistics.median(spec.ms_per_token for spec, _ in runs)
    base_ms = statistics.median(base.ms_per_token for _, base in runs)
    each = [c.speedup for c in cmps if c.speedup is not None]
    return WorkloadRow(
        workload=preset.id, title=preset.title, group=preset.group,
        speedup=base_ms / spec_ms if spec_ms > 0 else None,
        acceptance=_median_of(c.acceptance_drafted for c in cmps),
        tokens_per_round=_median_of(c.tokens_per_target_call for c in cmps),
        ms_per_token=spec_ms, baseline_ms_per_token=base_ms,
        new_tokens=float(statistics.median(len(spec.tokens) for spec, _ in runs)),
        identical=None if any(c.identical is None for c in cmps) else all(c.identical for c in cmps),
        speedup_low=min(each) if each else None, speedup_high=max(each) if each else None, repeats=len(runs),
    )


def _median_of(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def method_words(drafter: str, spec: GenerationConfig) -> str:
    """The speculative settings of a run, in a few words."""
    kind = drafters.spec(drafter)
    who = f"drafter: {kind.title}"
    if not kind.gamma_applies:
        gamma = "its own size per round"
    else:
        gamma = f"adaptive γ ≤ {spec.gamma}" if spec.adaptive else f"γ = {spec.gamma}"
    mode = "greedy" if spec.sampling.greedy else f"sampling T = {spec.sampling.temperature:g}"
    return f"speculative, {who}, {gamma}, {mode}, up to {spec.max_new_tokens} new tokens"


def workload_steps(pair: Any, config: WorkloadsConfig) -> Generator[Progress, None, WorkloadResults]:
    """The runner job: `repeats` rounds, each over every workload (the target alone, then speculative), so a slow
    spell lands on several workloads rather than all of one; a Progress per round and after each run."""
    budget, eos = config.spec.max_new_tokens, tuple(pair.eos_ids)
    total = budget * config.runs
    runs: dict[str, list[tuple[Generation, Generation]]] = {}
    skipped: dict[str, str] = {}
    steps_ms: list[float] = []
    done = 0
    for repeat in range(config.repeats):
        again = f" (run {repeat + 1} of {config.repeats})" if config.repeats > 1 else ""
        for preset in config.presets:
            if preset.id in skipped:
                continue
            yield Progress(done, total, f"{preset.title}{again}: target alone…")
            ids = encode_prompt(pair.tokenizer, preset.prompt)
            problem = prompt_problem(preset.prompt, len(ids), pair.context_length, budget)
            if problem:
                skipped[preset.id] = f"{preset.title}: {problem}"
                total -= 2 * budget * (config.repeats - repeat)
                continue
            base = yield from with_progress(
                autoregressive_generate(pair.target, pair.tokenizer, ids, config.baseline, eos),
                done, total, f"{preset.title}{again}, target alone", budget)
            yield Progress(done + budget, total, f"{preset.title}{again}: speculative…")
            drafter = drafting.resolve(config.drafter, pair, adaptive=config.spec.adaptive)
            spec = yield from with_progress(
                speculative_generate(pair.target, drafter, pair.tokenizer, ids, config.spec, eos),
                done + budget, total, f"{preset.title}{again}, speculative", budget)
            runs.setdefault(preset.id, []).append((spec, base))
            steps_ms.extend(r.verify_ms for r in base.rounds)
            done += 2 * budget
            speedup = metrics.compare(spec, base).speedup
            yield Progress(done, total, f"{preset.title}{again}: {speedup or 0:.2f}× speed-up")
    rows = tuple(_row(p, runs[p.id]) for p in config.presets if p.id in runs)
    step = statistics.median(steps_ms) if steps_ms else None
    return WorkloadResults("run", config.pair, method_words(config.drafter, config.spec), rows,
                           tuple(skipped.values()), step)


# ---------------------------------------------------------------------------------------------
# source 2: the latest `python -m specviz bench` file


@dataclass(frozen=True)
class BenchFile:
    """A benchmark CSV and what its Markdown twin says about where it came from."""

    path: Path
    modified: str  # the file's modification time (ISO, local)
    date: str | None  # "- date:" of the .md report, when present
    machine: str | None  # "- machine:"
    command: str | None  # "- command:"
    settings: str | None  # "- settings:"
    records: tuple[dict[str, Any], ...]  # CSV rows (NaN read as None)

    @property
    def pairs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(r["pair"]) for r in self.records if r.get("pair") is not None))

    def modes(self, pair: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(r["mode"]) for r in self.records if r.get("pair") == pair))

    def methods(self, pair: str, mode: str) -> tuple[str, ...]:
        """Every helper method of ours and transformers' of a pair and mode, in the benchmark's order (llama.cpp's rows
        are another engine, not a helper of this one: the bench file shows them, this page does not)."""
        names = {str(r["method"]) for r in self.records if r.get("pair") == pair and r.get("mode") == mode
                 and str(r.get("family", "")) != "llama"}
        names.discard(BASELINE)
        order = list(METHODS_BY_NAME)
        return tuple(sorted(names, key=lambda n: order.index(n) if n in order else len(order)))


def find_bench(pair: str, folder: Path = BENCH_DIR) -> Path | None:
    """bench-<pair>.csv if present, else the newest CSV in the folder that holds rows of this pair."""
    exact = folder / f"bench-{safe_name(pair)}.csv"
    if exact.is_file():
        return exact
    candidates = sorted(folder.glob("*.csv"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    for path in candidates:
        try:
            if pair in read_bench(path).pairs:
                return path
        except BenchReadError:
            continue
    return None


def _header_fields(md: Path) -> dict[str, str]:
    """The '- key: value' lines at the top of a bench .md report."""
    out: dict[str, str] = {}
    if not md.is_file():
        return out
    for line in md.read_text(encoding="utf-8").splitlines()[:12]:
        if line.startswith("- ") and ":" in line:
            key, value = line[2:].split(":", 1)
            out[key.strip()] = value.strip().strip("`")
    return out


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def read_bench(path: Path) -> BenchFile:
    """Read one bench CSV (and its .md header); BenchReadError if it is not a specviz bench file."""
    import pandas as pd

    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        # the reason (it may hold the server's path) stays in the traceback for the log, not in the page's line
        raise BenchReadError(f"{path.name} could not be read as a table") from exc
    missing = [c for c in NEEDED_COLUMNS + ("pair",) if c not in frame.columns]
    if missing:
        raise BenchReadError(f"{path.name} is not a `specviz bench` file (missing {', '.join(missing)}; "
                             f"expected columns like {', '.join(CSV_COLUMNS[:6])}, …)")
    records = tuple({k: _clean(v) for k, v in row.items()} for row in frame.to_dict("records"))
    head = _header_fields(path.with_suffix(".md"))
    modified = dt.datetime.fromtimestamp(path.stat().st_mtime).astimezone().isoformat(timespec="seconds")
    return BenchFile(path, modified, head.get("date"), head.get("machine"), head.get("command"),
                     head.get("settings"), records)


def default_method(methods: Sequence[str], drafter: str, gamma: int, adaptive: bool) -> str | None:
    """The benchmark method closest to the sidebar's settings (γ = 4 when nothing closer was measured)."""
    # a drafter whose rounds γ does not size (a tree, a lookup) has the bench's one method of its kind
    mine = [METHODS_BY_NAME[m] for m in methods if m in METHODS_BY_NAME and METHODS_BY_NAME[m].drafter == drafter]
    wanted = [m.name for m in mine if drafters.spec(drafter).length == "variable"]
    # a chain drafter's own method: the same γ (or adaptive), else its γ = 4 (the head's `eagle` for a head chain of 6)
    wanted += [m.name for m in mine if m.adaptive == adaptive and (adaptive or m.gamma == gamma)]
    wanted += [m.name for m in mine if not adaptive and not m.adaptive and m.gamma == 4]
    wanted += ["spec-adaptive"] if adaptive else [f"spec-g{gamma}"]
    wanted += ["spec-g4"]
    return next((m for m in wanted if m in methods), methods[0] if methods else None)


def bench_method_words(method: str) -> str:
    spec = METHODS_BY_NAME.get(method)
    return f"`{method}`: {spec.description}" if spec else f"`{method}`"


def bench_results(file: BenchFile, pair: str, method: str, mode: str) -> WorkloadResults:
    """One bar per workload for one method and mode of the file, in the presets' order."""
    rows = [r for r in file.records if r.get("pair") == pair and r.get("mode") == mode and r.get("method") == method]
    bases = {r["workload"]: r for r in file.records
             if r.get("pair") == pair and r.get("mode") == mode and r.get("method") == BASELINE}
    order = [p.id for p in PRESETS]
    rows.sort(key=lambda r: order.index(r["workload"]) if r["workload"] in order else len(order))
    out = []
    for r in rows:
        preset, base = get_preset(str(r["workload"])), bases.get(r["workload"])
        group = str(r.get("kind") or (preset.group if preset else "other"))
        out.append(WorkloadRow(
            workload=str(r["workload"]), title=preset.title if preset else str(r["workload"]),
            group=group,
            speedup=_num(r.get("speedup")), acceptance=_num(r.get("acceptance_rate")),
            tokens_per_round=_num(r.get("tokens_per_target_call")), ms_per_token=_num(r.get("ms_per_token")),
            baseline_ms_per_token=_num(base.get("ms_per_token")) if base else None,
            new_tokens=_num(r.get("new_tokens")), identical=_flag(r.get("identical_to_baseline")),
        ))
    return WorkloadResults("bench", pair, bench_method_words(method), tuple(out))


def _num(value: Any) -> float | None:
    value = _clean(value)
    return None if value is None else float(value)


def _flag(value: Any) -> bool | None:
    value = _clean(value)
    if value is None:
        return None
    return value if isinstance(value, bool) else str(value).strip().lower() == "true"
