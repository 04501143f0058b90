"""Side-by-side benchmark, running and measuring: ours vs transformers' assisted and plain generation (reports: bench.report)."""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch

from specviz import models
from specviz.settings import encode_prompt
from specviz.core.progress import drain
from specviz.core import metrics
from specviz.core import drafters
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import Generation, GenerationConfig
from specviz.core.drafters.hybrid import MIN_MATCH as HYBRID_MIN_MATCH, THRESHOLD as HYBRID_THRESHOLD
from specviz.core.drafters.tree import TreeConfig
from specviz.core.sampling import SamplingConfig
from specviz.models import datastore
from specviz.models.base import LoadProgress
from specviz.presets import PRESETS
from specviz.bench import gpu
from specviz.bench.profile import ProfileRow, profile_run

Mode = Literal["greedy", "sample"]

SAMPLE_TEMPERATURE = 0.7  # the sampling mode's temperature (top-k off, top-p 1: the plain tempered p)
WARMUP_TOKENS = 8  # untimed warm-up run per method before the repeats of each (pair, workload, mode)
LOOKUP_TOKENS = 10  # hf-lookup's prompt_lookup_num_tokens (transformers' example value); ngram uses it as γ
MIN_REPEATS = 3  # a median of fewer runs is not a median worth printing


class BenchError(ValueError):
    """A bad benchmark setting, or a run that could not be made fair (one line, for the CLI)."""


# ---------------------------------------------------------------------------------------------
# the tables: workloads and methods


@dataclass(frozen=True)
class Workload:
    """One prompt of the benchmark: an app preset under the benchmark's names (raw text, no chat template)."""

    name: str  # the preset id: the CSV's workload column, read back by the Where it helps lab
    kind: Literal["predictable", "creative"]  # the preset's group: what we expect of draft/target agreement
    prompt: str
    copying: bool  # the answer copies text from the prompt: prompt lookup (hf-lookup, ngram) applies


WORKLOADS: tuple[Workload, ...] = tuple(Workload(p.id, p.group, p.prompt, p.copies_prompt) for p in PRESETS)
WORKLOADS_BY_NAME = {w.name: w for w in WORKLOADS}


@dataclass(frozen=True)
class Method:
    """One way of generating: ours (specviz.core.engine) or transformers' generate."""

    name: str
    family: Literal["ours", "hf"]
    description: str
    drafter: str | None = None  # ours: a name in the drafter registry (core.drafters); None = target only
    gamma: int = 4  # ours: draft length (the ceiling when adaptive)
    adaptive: bool = False  # ours: AdaptiveGamma + the drafter's confidence stop
    assistant: bool = False  # hf: assistant_model=pair.draft (transformers' default schedule)
    lookup: bool = False  # hf: prompt_lookup_num_tokens=LOOKUP_TOKENS
    copying_only: bool = False  # run on copying workloads only


METHODS: tuple[Method, ...] = (
    Method("target", "ours", "target alone, one forward per token (autoregressive_generate): the baseline"),
    Method("spec-g2", "ours", "speculative, model drafter, γ=2", "model", 2),
    Method("spec-g4", "ours", "speculative, model drafter, γ=4", "model", 4),
    Method("spec-g8", "ours", "speculative, model drafter, γ=8", "model", 8),
    Method("spec-adaptive", "ours", "speculative, model drafter, adaptive γ ≤ 16 (confidence stop + throughput switch)",
           "model", 16, adaptive=True),
    Method("spec-tree", "ours", "speculative, model drafter, token tree (TreeConfig defaults: budget {t.budget}, "
           "branching {t.branching}, depth {t.depth}, min score {t.min_score}), one target pass per tree".format(t=TreeConfig()),
           "tree"),
    Method("hf-plain", "hf", "transformers generate, target alone"),
    Method("hf-assisted", "hf", "transformers assisted generation, assistant_model = the draft (default schedule)",
           assistant=True),
    Method("hf-lookup", "hf", f"transformers prompt lookup, prompt_lookup_num_tokens={LOOKUP_TOKENS}",
           lookup=True, copying_only=True),
    Method("ngram", "ours", f"speculative, n-gram (prompt lookup) drafter, γ={LOOKUP_TOKENS}", "ngram", LOOKUP_TOKENS),
    Method("suffix", "ours", "speculative, memory drafter (suffix match over the text and the datastore; no earlier "
           "run: every run starts cold)", "suffix"),
    Method("hybrid", "ours", f"speculative, memory when its match is ≥ {HYBRID_MIN_MATCH} tokens and it expects ≥ "
           f"{HYBRID_THRESHOLD:g} accepted tokens, else the model drafter (γ=4); starts cold", "hybrid", 4),
    Method("eagle", "ours", "speculative, the pair's trained EAGLE-style head (one layer on the target's features), "
           "chain γ=4", "eagle", 4),
    Method("eagle-adaptive", "ours", "speculative, the pair's trained EAGLE-style head, adaptive γ ≤ 16 (the head's "
           "confidence stop + throughput switch)", "eagle", 16, adaptive=True),
    Method("eagle-tree", "ours", "speculative, the pair's trained EAGLE-style head, token tree (TreeConfig defaults), "
           "one target pass per tree (EAGLE-2)", "eagle-tree"),
)
METHODS_BY_NAME = {m.name: m for m in METHODS}
BASELINE = "target"
MODES: tuple[Mode, ...] = ("greedy", "sample")

FULL_PAIRS = ("qwen-coder", "smollm2-135m")
QUICK_PAIRS = ("qwen-coder",)
QUICK_WORKLOADS = ("code", "list", "story")
# --quick: 3 workloads, greedy, 32 tokens, qwen-coder: about 15 minutes on the 2-core CPU
QUICK_METHODS = ("target", "spec-g4", "spec-adaptive", "spec-tree", "hf-plain", "hf-assisted", "ngram", "suffix", "hybrid",
                 "eagle", "eagle-adaptive", "eagle-tree")
QUICK_TOKENS, FULL_TOKENS = 32, 64


@dataclass(frozen=True)
class BenchConfig:
    """Everything one `specviz bench` run does (frozen: it is printed with the results)."""

    pairs: tuple[str, ...]  # model pairs, benchmarked one after another (one loaded at a time)
    workloads: tuple[str, ...]  # names from WORKLOADS
    methods: tuple[str, ...]  # names from METHODS; always starts with the baseline "target"
    modes: tuple[Mode, ...]  # greedy and/or sample (T=SAMPLE_TEMPERATURE)
    repeats: int  # timed runs per method; the table shows their median
    max_new_tokens: int  # per run (EOS may stop a run earlier; ms/token divides by what was made)
    out_dir: Path  # where bench-<pair>.{csv,md,html} go
    device: str | None = None  # "cpu" or "cuda"; None = models.load_pair's choice
    draft_precision: str | None = None  # "int8", "bf16" or "fp32"; None = measured at load (models.precision)
    target_precision: str | None = None  # "fp32", "fp16w", "bf16" or "int8"; None = chosen at load (keeps identity)
    quick: bool = False
    command: str = ""  # the command line, for the report header
    temperature: float = SAMPLE_TEMPERATURE
    warmup_tokens: int = WARMUP_TOKENS
    profile: bool = True  # one extra run of each of our methods with lap timers on: the report's round profile


def _split_names(text: str | None, known: Sequence[str], what: str) -> tuple[str, ...] | None:
    """'a,b,c' -> ('a', 'b', 'c'), each checked against the known names (None when not given)."""
    if text is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise BenchError(f"--{what} is empty: choose from {', '.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BenchError(f"unknown {what} {', '.join(map(repr, unknown))}: choose from {', '.join(known)}")
    return names


def make_config(
    pairs: Sequence[str] | None = None,
    quick: bool = False,
    workloads: str | None = None,
    methods: str | None = None,
    repeats: int | None = None,
    max_new_tokens: int | None = None,
    out_dir: str | Path = "benchmarks",
    device: str | None = None,
    draft_precision: str | None = None,
    command: str = "",
    target_precision: str | None = None,
    modes: str | None = None,
    profile: bool = True,
) -> BenchConfig:
    """The run's settings from command-line values: --quick picks smaller defaults, explicit values win."""
    repeats = MIN_REPEATS if repeats is None else repeats
    if repeats < MIN_REPEATS:
        raise BenchError(f"--repeats must be >= {MIN_REPEATS} (the table reports medians), got {repeats}")
    tokens = (QUICK_TOKENS if quick else FULL_TOKENS) if max_new_tokens is None else max_new_tokens
    if tokens < 1:
        raise BenchError(f"--max-new-tokens must be >= 1, got {tokens}")
    wl = _split_names(workloads, list(WORKLOADS_BY_NAME), "workloads") or (QUICK_WORKLOADS if quick else tuple(WORKLOADS_BY_NAME))
    ms = _split_names(methods, list(METHODS_BY_NAME), "methods") or (QUICK_METHODS if quick else tuple(METHODS_BY_NAME))
    ms = (BASELINE, *(m for m in ms if m != BASELINE))  # the baseline always runs, and first in each repeat
    return BenchConfig(
        pairs=tuple(dict.fromkeys(pairs)) if pairs else (QUICK_PAIRS if quick else FULL_PAIRS),
        workloads=wl,
        methods=ms,
        modes=_split_names(modes, list(MODES), "modes") or (("greedy",) if quick else MODES),  # type: ignore[arg-type]
        repeats=repeats,
        max_new_tokens=tokens,
        out_dir=Path(out_dir),
        device=device,
        draft_precision=draft_precision,
        target_precision=target_precision,
        quick=quick,
        command=command,
        profile=profile,
    )


def methods_for(workload: Workload, methods: Sequence[str], pair: Any = None) -> tuple[Method, ...]:
    """The methods that apply to a workload (prompt lookup only where the answer copies the prompt) and, given the
    loaded pair, that it can run (a head's methods need the pair's trained head)."""
    chosen = (METHODS_BY_NAME[m] for m in methods)
    return tuple(m for m in chosen if (workload.copying or not m.copying_only) and _runs_on(m, pair))


def _runs_on(method: Method, pair: Any) -> bool:
    if pair is None or method.drafter is None:
        return True
    return not drafters.spec(method.drafter).needs_head or getattr(pair, "head", None) is not None


# ---------------------------------------------------------------------------------------------
# one timed run


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


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process; False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """VmHWM of this process in MB (None off Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sampling_config(mode: str, seed: int, temperature: float = SAMPLE_TEMPERATURE) -> SamplingConfig:
    """Ours: greedy, or the tempered p with top-k off and top-p 1; seeded per repeat."""
    if mode == "greedy":
        return SamplingConfig(mode="greedy", seed=seed)
    return SamplingConfig(mode="sample", temperature=temperature, top_k=0, top_p=1.0, seed=seed)


def run_ours(pair: Any, method: Method, prompt_ids: Sequence[int], mode: str, seed: int,
             max_new_tokens: int, temperature: float = SAMPLE_TEMPERATURE) -> Generation:
    """One run of our engine (target-only, or speculative with the method's drafter)."""
    cfg = GenerationConfig(
        max_new_tokens=max_new_tokens, gamma=method.gamma, adaptive=method.adaptive,
        sampling=sampling_config(mode, seed, temperature),
    )
    eos = tuple(pair.eos_ids)
    if method.drafter is None:
        steps = autoregressive_generate(pair.target, pair.tokenizer, prompt_ids, cfg, eos)
    else:
        drafter = drafters.build(method.drafter, pair.draft, pair.target, adaptive=method.adaptive,
                                 memory=datastore.shared_memory(method.drafter, pair),  # cold: the datastore only
                                 head=pair.head_for(method.drafter))
        steps = speculative_generate(pair.target, drafter, pair.tokenizer, prompt_ids, cfg, eos)
    gen = drain(steps)
    _sync(pair.device)
    return gen


# generate() fills every field we leave None from the model's own generation_config; these would
# change the tokens or the timing, so they must stay unset there (we set the others explicitly)
_MUST_BE_UNSET = (
    "min_p", "top_h", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
    "forced_bos_token_id", "forced_eos_token_id", "exponential_decay_length_penalty", "guidance_scale",
    "watermarking_config", "stop_strings", "max_time", "penalty_alpha", "dola_layers", "constraints",
    "force_words_ids", "cache_implementation", "prefill_chunk_size",
)


def hf_generation_config(pair: Any, method: Method, mode: str, max_new_tokens: int,
                         temperature: float = SAMPLE_TEMPERATURE) -> Any:
    """An explicit transformers.GenerationConfig: the same decoding rule as ours, nothing from the model's config."""
    from transformers import GenerationConfig as HFGenerationConfig

    sample = mode == "sample"
    pad = pair.tokenizer.pad_token_id
    cfg = HFGenerationConfig(
        do_sample=sample,
        temperature=temperature if sample else 1.0,
        top_k=0 if sample else None,  # 0 = off (no top-k warper); greedy applies no warper at all
        top_p=1.0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        encoder_no_repeat_ngram_size=0,
        length_penalty=1.0,
        renormalize_logits=False,
        remove_invalid_values=False,
        num_beams=1,
        num_return_sequences=1,
        min_length=0,
        max_new_tokens=max_new_tokens,
        use_cache=True,
        eos_token_id=list(pair.eos_ids),
        pad_token_id=pad if pad is not None else pair.eos_ids[0],
        prompt_lookup_num_tokens=LOOKUP_TOKENS if method.lookup else None,
    )
    for model in (pair.target, pair.draft):
        model_cfg = getattr(model, "generation_config", None)
        for key in _MUST_BE_UNSET:
            if model_cfg is not None and getattr(model_cfg, key, None) not in (None, False) and getattr(cfg, key, None) is None:
                raise BenchError(f"the model's generation_config sets {key}={getattr(model_cfg, key)!r}; "
                                 "it would leak into transformers' generate and make the comparison unfair")
    return cfg


def run_hf(pair: Any, method: Method, prompt_ids: Sequence[int], mode: str, seed: int,
           max_new_tokens: int, temperature: float = SAMPLE_TEMPERATURE) -> tuple[tuple[int, ...], float]:
    """One transformers generate call: (new ids, elapsed ms including prefill)."""
    cfg = hf_generation_config(pair, method, mode, max_new_tokens, temperature)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=pair.device)  # (1, n)
    extra = {"assistant_model": pair.draft} if method.assistant else {}
    with torch.inference_mode():
        if mode == "sample":
            torch.manual_seed(seed)  # transformers samples from the global RNG (benchmark process only)
        _sync(pair.device)
        t0 = time.perf_counter()
        out = pair.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg, **extra)
        _sync(pair.device)
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
    return tuple(out[0, ids.shape[1]:].tolist()), elapsed_ms


def measure(pair: Any, pair_name: str, workload: Workload, method: Method, prompt_ids: Sequence[int],
            mode: str, repeat: int, max_new_tokens: int, temperature: float = SAMPLE_TEMPERATURE,
            baseline: Generation | None = None) -> tuple[RunRecord, Generation | None]:
    """One timed, recorded run (seed = repeat index, so every method sees the same seeds) and ours' Generation.

    `baseline` is the same repeat's target-only run: a drafting method's figures are metrics.compare's.
    """
    reset_peak_rss()
    key = dict(pair=pair_name, workload=workload.name, mode=mode, method=method.name, repeat=repeat)
    if method.family == "hf":
        tokens, ms = run_hf(pair, method, prompt_ids, mode, repeat, max_new_tokens, temperature)
        return RunRecord(**key, tokens=tokens, ms_per_token=ms / max(1, len(tokens)), peak_rss_mb=peak_rss_mb()), None
    gen = run_ours(pair, method, prompt_ids, mode, repeat, max_new_tokens, temperature)
    rss = peak_rss_mb()
    figures: dict[str, Any] = {"tokens_per_target_call": metrics.tokens_per_target_call(gen.rounds)}
    if method.drafter:
        cmp = metrics.compare(gen, baseline)
        figures.update(acceptance_rate=cmp.acceptance_drafted, alpha_checked=cmp.alpha_checked, c=cmp.c,
                       expected_speedup_measured_verify=cmp.expected_speedup_measured_verify, gamma=cmp.gamma,
                       acceptance_by_position=cmp.acceptance_by_position, gpu_expected=_on_gpu(gen, pair_name, method))
    record = RunRecord(**key, tokens=gen.tokens, ms_per_token=(gen.prefill_ms + gen.decode_ms) / max(1, len(gen.tokens)),
                       peak_rss_mb=rss, **figures)
    return record, gen


def _on_gpu(gen: Generation, pair_name: str, method: Method) -> float | None:
    """The run's rounds at the H200's measured costs, for the pair whose shapes were measured there (else None)."""
    costs = gpu.load_costs() if pair_name == gpu.PAIR else None
    if costs is None or method.drafter is None:
        return None
    return gpu.expected_for(gen, costs, method.drafter)


def warm_up(pair: Any, method: Method, prompt_ids: Sequence[int], mode: str, tokens: int, temperature: float) -> None:
    """An untimed short run: lazy set-up and first touches of the weights are not billed to a repeat."""
    if method.family == "hf":
        run_hf(pair, method, prompt_ids, mode, 0, tokens, temperature)
    else:
        run_ours(pair, method, prompt_ids, mode, 0, tokens, temperature)


# ---------------------------------------------------------------------------------------------
# aggregation: repeats -> one row per (pair, workload, mode, method)


@dataclass(frozen=True)
class BenchRow:
    """One line of the table: medians over the repeats, speed-up against the baseline of the same run."""

    pair: str
    workload: str
    kind: str  # predictable / creative
    mode: str
    method: str
    family: str  # ours / hf
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
        hf_plain = {r.repeat: r for r in by_method.get("hf-plain", [])}
        base_ms = _median(r.ms_per_token for r in base.values())
        for method in sorted(by_method, key=method_order):
            rows.append(_row(pair, workload, mode, method, by_method[method], base, hf_plain, base_ms))
    return rows


def _row(pair: str, workload: str, mode: str, method: str, recs: list[RunRecord],
         base: dict[int, RunRecord], hf_plain: dict[int, RunRecord], base_ms: float | None) -> BenchRow:
    spec = METHODS_BY_NAME.get(method)
    wl = WORKLOADS_BY_NAME.get(workload)
    ms = statistics.median(r.ms_per_token for r in recs)
    alpha, c, gamma = _median(r.alpha_checked for r in recs), _median(r.c for r in recs), _median(r.gamma for r in recs)
    chain = spec is None or spec.drafter is None or metrics.chain_formula_applies(spec.drafter)
    expected = metrics.expected_speedup(alpha, gamma, c) if chain and None not in (alpha, gamma, c) and gamma > 0 else None
    greedy = mode == "greedy"
    is_hf = spec.family == "hf" if spec else method.startswith("hf-")
    rss = [r.peak_rss_mb for r in recs if r.peak_rss_mb is not None]
    return BenchRow(
        pair=pair, workload=workload, kind=wl.kind if wl else "", mode=mode, method=method,
        family=spec.family if spec else ("hf" if is_hf else "ours"),
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
        identical_to_hf_plain=_all_equal(recs, hf_plain) if greedy and is_hf and method != "hf-plain" else None,
        acceptance_by_position=_median_by_position(recs),
        gpu_expected=_median(r.gpu_expected for r in recs),
    )


# ---------------------------------------------------------------------------------------------
# the run


def _say(message: str) -> None:
    print(f"specviz bench: {message}", file=sys.stderr, flush=True)


def _eta(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def encode(pair: Any, prompt: str, max_new_tokens: int) -> list[int]:
    """Raw-text prompt ids; refused when prompt plus new tokens would not fit the pair's context."""
    ids = encode_prompt(pair.tokenizer, prompt)
    ctx = getattr(pair, "context_length", None)
    if not ids:
        raise BenchError(f"the prompt {prompt[:30]!r} encodes to no tokens")
    if ctx and len(ids) + max_new_tokens > ctx:
        raise BenchError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceeds the context of {ctx}")
    return ids


def _config_snapshot(pair: Any) -> tuple[dict, dict]:
    return tuple(copy.deepcopy(m.generation_config.to_dict()) for m in (pair.target, pair.draft))  # type: ignore[return-value]


def bench_pair(config: BenchConfig, pair: Any, pair_name: str) -> tuple[list[RunRecord], list[ProfileRow]]:
    """Every workload and mode of one loaded pair, methods interleaved within each repeat; then, unless the config says
    not to, one profiled run of each of our methods (bench.profile) after the timed ones."""
    plan = [(WORKLOADS_BY_NAME[w], mode) for w in config.workloads for mode in config.modes]
    total = sum(len(methods_for(w, config.methods, pair)) for w, _ in plan) * config.repeats
    left_out = [m for m in config.methods if not _runs_on(METHODS_BY_NAME[m], pair)]
    if left_out:
        _say(f"{pair_name}: left out {', '.join(left_out)}: " + (getattr(pair, "head_problem", "")
                                                               or "this pair ships no trained head"))
    before = _config_snapshot(pair)
    records: list[RunRecord] = []
    profiles: list[ProfileRow] = []
    t_start = time.perf_counter()
    for workload, mode in plan:
        prompt_ids = encode(pair, workload.prompt, config.max_new_tokens)
        methods = methods_for(workload, config.methods, pair)
        _say(f"{pair_name} {workload.name}/{mode}: warming up {', '.join(m.name for m in methods)}")
        for method in methods:
            warm_up(pair, method, prompt_ids, mode, min(config.warmup_tokens, config.max_new_tokens), config.temperature)
        for repeat in range(config.repeats):
            baseline: Generation | None = None  # the target runs first in each repeat (make_config)
            for method in methods:
                rec, gen = measure(pair, pair_name, workload, method, prompt_ids, mode, repeat,
                                   config.max_new_tokens, config.temperature, baseline)
                if method.name == BASELINE:
                    baseline = gen
                records.append(rec)
                done = len(records)
                left = (time.perf_counter() - t_start) / done * (total - done)
                _say(f"[{done}/{total}] {pair_name} {workload.name}/{mode} repeat {repeat + 1}/{config.repeats} "
                     f"{method.name}: {rec.ms_per_token:.1f} ms/token, {len(rec.tokens)} tokens (~{_eta(left)} left)")
        if config.profile:
            _say(f"{pair_name} {workload.name}/{mode}: one profiled run of each of our methods")
            for method in methods:
                if method.family == "ours":
                    found = profile_run(pair, lambda m=method: run_ours(pair, m, prompt_ids, mode, 0, config.max_new_tokens,
                                                                         config.temperature))
                    profiles.append(ProfileRow(pair_name, workload.name, mode, method.name, found))
    if _config_snapshot(pair) != before:
        raise BenchError("a model's generation_config changed during the benchmark (models must stay read-only)")
    return records, profiles


WriteReports = Callable[[BenchConfig, Any, str, Sequence[BenchRow], Sequence[ProfileRow]], dict[str, Path]]


def run_bench(config: BenchConfig, write: WriteReports,
              progress: LoadProgress | None = None) -> list[tuple[str, list[BenchRow], dict[str, Path]]]:
    """Load each pair in turn, benchmark it, `write` its reports (bench.report); returns (pair, rows, paths) per pair."""
    results = []
    for name in config.pairs:
        _say(f"loading {name}")
        pair = models.load_pair(name, draft_precision=config.draft_precision, device=config.device, progress=progress,
                                target_precision=config.target_precision)
        records, profiles = bench_pair(config, pair, name)
        rows = aggregate(records)
        paths = write(config, pair, name, rows, profiles)
        _say(f"{name}: wrote {', '.join(str(p) for p in paths.values())}")
        results.append((name, rows, paths))
        del pair
        gc.collect()
    return results
