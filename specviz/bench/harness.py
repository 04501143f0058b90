"""Side-by-side benchmark, running and measuring: ours vs transformers' assisted and plain generation (reports: bench.report)."""

from __future__ import annotations

import contextlib
import copy
import gc
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specviz import models
from specviz.settings import encode_prompt
from specviz.core.progress import drain
from specviz.core import metrics
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.trace import Generation, GenerationConfig
from specviz.core.sampling import SamplingConfig
from specviz.models import drafting
from specviz.models.base import LoadProgress
from specviz.bench import gpu, llama, passes
from specviz.bench.profile import ProfileRow, profile_run
from specviz.bench.methods import (  # noqa: F401  (the tables: the bench's names, read from here by the report and tests)
    BASELINE, FULL_PAIRS, FULL_TOKENS, LOOKUP_TOKENS, METHODS, METHODS_BY_NAME, MIN_REPEATS, MODES, QUICK_METHODS, QUICK_PAIRS,
    QUICK_TOKENS, QUICK_WORKLOADS, SAMPLE_TEMPERATURE, WARMUP_TOKENS, WORKLOADS, WORKLOADS_BY_NAME, BenchError, Method, Mode,
    Workload,
)
from specviz.bench.rows import CSV_COLUMNS, BenchRow, RunRecord, aggregate, method_order  # noqa: F401  (the bench's names)


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
    return drafting.can_run(method.drafter, pair)


# ---------------------------------------------------------------------------------------------
# one timed run


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
        # cold: a remembering drafter gets the datastore only
        drafter = drafting.resolve(method.drafter, pair, adaptive=method.adaptive)
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


def run_llama(pair: Any, peer: llama.LlamaPeer, method: Method, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    """One llama.cpp run: RunRecord's fields. Its text is read back into ids by the pair's tokenizer (llama.cpp prints
    text, not ids) and cut at max_new_tokens (a speculative run may make its last round's few more)."""
    run = peer.generate(prompt, max_new_tokens, method.gamma if method.peer_draft else None)
    ids = tuple(pair.tokenizer(run.text, add_special_tokens=False)["input_ids"])[:max_new_tokens]
    figures: dict[str, Any] = {"tokens": ids, "ms_per_token": run.ms_per_token}
    if method.peer_draft:
        figures.update(acceptance_rate=run.acceptance, gamma=float(method.gamma))
    return figures


def measure(pair: Any, pair_name: str, workload: Workload, method: Method, prompt_ids: Sequence[int],
            mode: str, repeat: int, max_new_tokens: int, temperature: float = SAMPLE_TEMPERATURE,
            baseline: Generation | None = None, peer: llama.LlamaPeer | None = None) -> tuple[RunRecord, Generation | None]:
    """One timed, recorded run (seed = repeat index, so every method sees the same seeds) and ours' Generation.

    `baseline` is the same repeat's target-only run: a drafting method's figures are metrics.compare's. `peer` runs
    the llama.cpp methods (its own process and timers: no peak RSS of ours).
    """
    reset_peak_rss()
    key = dict(pair=pair_name, workload=workload.name, mode=mode, method=method.name, repeat=repeat)
    if method.family == "llama":
        if peer is None:
            raise BenchError(f"{method.name} needs llama.cpp beside the pair: {llama.why_no_peer(pair_name)}")
        return RunRecord(**key, **run_llama(pair, peer, method, workload.prompt, max_new_tokens)), None
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


def warm_up(pair: Any, method: Method, prompt_ids: Sequence[int], mode: str, tokens: int, temperature: float,
            peer: llama.LlamaPeer | None = None, prompt: str = "") -> None:
    """An untimed short run: lazy set-up and first touches of the weights are not billed to a repeat."""
    if method.family == "llama":
        if peer is not None:  # llama.cpp's file pages into the page cache once, not inside the first repeat
            peer.generate(prompt, tokens, method.gamma if method.peer_draft else None)
    elif method.family == "hf":
        run_hf(pair, method, prompt_ids, mode, 0, tokens, temperature)
    else:
        run_ours(pair, method, prompt_ids, mode, 0, tokens, temperature)


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


def bench_pair(config: BenchConfig, pair: Any,
               pair_name: str) -> tuple[list[RunRecord], list[ProfileRow], passes.PassCosts]:
    """Every workload and mode of one loaded pair, methods interleaved within each repeat; then, unless the config says
    not to, one profiled run of each of our methods (bench.profile) after the timed ones; last, the target's pass
    costs (bench.passes). llama.cpp's methods and passes run beside ours, greedy only, where its build is in the
    cache (benchmarks/llama_cpp.py makes it)."""
    wants_llama = any(METHODS_BY_NAME[m].family == "llama" for m in config.methods)
    why_not = llama.why_no_peer(pair_name) if wants_llama else None
    if why_not:
        _say(f"{pair_name}: left out llama.cpp's methods: {why_not}")
    with llama.peer_for(pair_name, torch.get_num_threads()) if wants_llama and not why_not \
            else contextlib.nullcontext() as peer:
        records, profiles = _bench_pair(config, pair, pair_name, peer)
        _say(f"{pair_name}: timing one pass over {', '.join(map(str, passes.PASS_ROWS))} new tokens"
             + (", ours and llama.cpp's" if peer else ""))
        return records, profiles, passes.measure(pair, peer)


def _runs_in(method: Method, mode: str, peer: llama.LlamaPeer | None) -> bool:
    """llama.cpp's methods: greedy, and only with llama.cpp beside the pair."""
    return method.family != "llama" or (peer is not None and mode == "greedy")


def _bench_pair(config: BenchConfig, pair: Any, pair_name: str,
                peer: llama.LlamaPeer | None) -> tuple[list[RunRecord], list[ProfileRow]]:
    plan = [(WORKLOADS_BY_NAME[w], mode) for w in config.workloads for mode in config.modes]
    chosen = {(w.name, mode): tuple(m for m in methods_for(w, config.methods, pair) if _runs_in(m, mode, peer))
              for w, mode in plan}
    total = sum(len(ms) for ms in chosen.values()) * config.repeats
    for m in config.methods:
        if not _runs_on(METHODS_BY_NAME[m], pair):
            _say(f"{pair_name}: left out {m}: {drafting.why_not(METHODS_BY_NAME[m].drafter, pair)}")
    before = _config_snapshot(pair)
    records: list[RunRecord] = []
    profiles: list[ProfileRow] = []
    t_start = time.perf_counter()
    for workload, mode in plan:
        prompt_ids = encode(pair, workload.prompt, config.max_new_tokens)
        methods = chosen[(workload.name, mode)]
        _say(f"{pair_name} {workload.name}/{mode}: warming up {', '.join(m.name for m in methods)}")
        for method in methods:
            warm_up(pair, method, prompt_ids, mode, min(config.warmup_tokens, config.max_new_tokens), config.temperature,
                    peer, workload.prompt)
        for repeat in range(config.repeats):
            baseline: Generation | None = None  # the target runs first in each repeat (make_config)
            for method in methods:
                rec, gen = measure(pair, pair_name, workload, method, prompt_ids, mode, repeat,
                                   config.max_new_tokens, config.temperature, baseline, peer)
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


WriteReports = Callable[[BenchConfig, Any, str, Sequence[BenchRow], Sequence[ProfileRow], passes.PassCosts | None],
                        dict[str, Path]]


def run_bench(config: BenchConfig, write: WriteReports,
              progress: LoadProgress | None = None) -> list[tuple[str, list[BenchRow], dict[str, Path]]]:
    """Load each pair in turn, benchmark it, `write` its reports (bench.report); returns (pair, rows, paths) per pair."""
    results = []
    for name in config.pairs:
        _say(f"loading {name}")
        pair = models.load_pair(name, draft_precision=config.draft_precision, device=config.device, progress=progress,
                                target_precision=config.target_precision)
        records, profiles, costs = bench_pair(config, pair, name)
        rows = aggregate(records)
        paths = write(config, pair, name, rows, profiles, costs)
        _say(f"{name}: wrote {', '.join(str(p) for p in paths.values())}")
        results.append((name, rows, paths))
        del pair
        gc.collect()
    return results
