"""`specviz same-answer`: the Same answer lab's measurement (greedy identity, then a chi-square test of samples)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from specviz.cli.common import (
    GAMMA_MAX, GAMMA_MIN, CliError, check_flag, encoded_prompt, quiet_libraries, resolve_pair_name, stderr_progress,
)
from specviz.core import drafters, limits
from specviz.core.limits import DEFAULT_GAMMA, SAMPLE_TOKENS_RANGE, SAMPLES_RANGE

if TYPE_CHECKING:  # these load torch: imported where a run needs them, never for --help
    from specviz.labs.same_answer import FitTest, GreedyComparison, SampleCounts


def add_same_answer(sub: argparse._SubParsersAction) -> None:
    """The `same-answer` subcommand's parser."""
    p = sub.add_parser(
        "same-answer", help="is speculative decoding lossless? greedy identity and a chi-square test of samples",
        description="Greedy identity (speculative vs target alone), then N sampled continuations with the exact "
        "rule and with the deliberately wrong top-k rule, each tested against the target's exact law "
        "(the measurement of the app's 'Same answer' page).",
    )
    p.add_argument("--pair", default="smollm2-135m", help="model pair (default smollm2-135m)")
    p.add_argument("--preset", default="story", help="preset prompt id: code, json, list, copy, story, poem (default story)")
    p.add_argument("--samples", type=int, default=2000, help=f"samples per method, {SAMPLES_RANGE[0]}..{SAMPLES_RANGE[1]} (default 2000)")
    p.add_argument("--tokens", type=int, default=2, help=f"tokens per sample, {SAMPLE_TOKENS_RANGE[0]}..{SAMPLE_TOKENS_RANGE[1]} (default 2)")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0 (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus mass in (0, 1] (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    p.add_argument("--gamma", type=int, default=DEFAULT_GAMMA,
                   help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default {DEFAULT_GAMMA})")
    p.add_argument("--k", type=int, default=3, help="k of the wrong top-k rule (default 3)")
    p.add_argument("--greedy-tokens", type=int, default=64, help="new tokens of the greedy comparison (default 64)")
    p.add_argument("--int8-twin", action="store_true",
                   help="also run the greedy comparison on the target's dynamic-int8 twin (batch-variant arithmetic: "
                   "the lesson that the promise needs the same arithmetic; fp32 targets on a CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress or library warnings on stderr")
    p.set_defaults(func=cmd_same_answer)


def cmd_same_answer(args: argparse.Namespace) -> int:
    """The greedy comparison(s), then the target's exact law against its own samples and both speculative rules."""
    from specviz.presets import PRESETS, get_preset

    preset = get_preset(args.preset)
    if preset is None:
        raise CliError(f"unknown --preset {args.preset!r}: choose from {', '.join(p.id for p in PRESETS)}")
    check_same_answer_arguments(args)
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.core.progress import drain
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig
    from specviz.labs import same_answer as lab

    try:
        sampling = SamplingConfig("sample", args.temperature, top_p=args.top_p, seed=args.seed)
        cfg = lab.SampleConfig(sampling, args.samples, args.tokens)
        gcfg = GenerationConfig(max_new_tokens=args.greedy_tokens, gamma=args.gamma, sampling=SamplingConfig("greedy"))
    except ValueError as e:
        raise CliError(str(e)) from None
    pair = models.load_pair(pair_name, progress=stderr_progress(args.quiet))
    ids = encoded_prompt(pair, preset.prompt, args.greedy_tokens)
    for twin in (False, True) if args.int8_twin else (False,):
        t0 = time.perf_counter()
        try:
            cmp = drain(lab.greedy_job(pair, ids, drafters.DEFAULT, gcfg, batch_variant=twin))
        except models.PairError as e:
            raise CliError(str(e)) from None
        label = f"pair {pair_name}, preset {args.preset!r}" + (", target's int8 twin" if twin else "")
        print(greedy_line(label, cmp, time.perf_counter() - t0), flush=True)
    t0 = time.perf_counter()
    ref = drain(lab.reference_job(pair.target, pair.tokenizer, ids, cfg))
    fit = lab.fit_test(ref.law, ref.target)
    print(f"N={args.samples}, {args.tokens} tokens, T={args.temperature}, top-p={args.top_p}, seed={args.seed}: exact "
          f"law {len(ref.law.sequences)} bins covering {ref.law.covered:.3f}; target alone "
          f"{time.perf_counter() - t0:.1f} s: chi2={fit.chi2:.1f} dof={fit.dof} p={fit.pvalue:.3g} TV={fit.tv:.4f}",
          flush=True)
    for rule in ("exact", "topk"):
        t0 = time.perf_counter()
        spec = lab.SpecConfig(args.gamma, drafters.DEFAULT, rule, args.k)
        counts = drain(lab.speculative_job(pair.target, pair.draft, pair.tokenizer, ids, cfg, spec, pair.head_for(spec.drafter)))
        fit = lab.fit_test(ref.law, counts)
        print(rule_line(rule, args.k, time.perf_counter() - t0, counts, fit), flush=True)
    return 0


def check_same_answer_arguments(args: argparse.Namespace) -> None:
    """The flags' ranges (specviz.core.limits'), refused in one line before any model loads."""
    check_flag("--gamma", limits.check_gamma, args.gamma)
    check_flag("--greedy-tokens", limits.check_max_new_tokens, args.greedy_tokens)
    check_flag("--tokens", limits.check_samples, args.samples, args.tokens)
    check_flag("--samples", limits.check_within, "samples", args.samples, *limits.SAMPLES_RANGE)
    check_flag("--temperature", limits.check_temperature, "sample", args.temperature)
    check_flag("--top-p", limits.check_top_p, args.top_p)


def greedy_line(label: str, cmp: GreedyComparison, seconds: float) -> str:
    """One printed line of a greedy comparison, with the target's own top-2 gap where the runs part."""
    line = (f"{label}: greedy {cmp.n_same}/{cmp.n_compared} tokens equal, identical={cmp.identical}, "
            f"first divergence={cmp.first_divergence} ({seconds:.1f} s)")
    if cmp.gap is not None:
        line += f"; there the target's top-2 gap is {cmp.gap.top2_gap:.3g} logits, the two picks' {cmp.gap.pair_gap:.3g}"
    return line


def rule_line(rule: str, k: int, seconds: float, counts: SampleCounts, fit: FitTest) -> str:
    """One printed line of a speculative rule's samples tested against the target's exact law."""
    name = "exact rule" if rule == "exact" else f"top-{k} shortcut"
    return (f"speculative, {name}: {seconds:.1f} s, accepted {counts.accepted}/{counts.drafted}: "
            f"chi2={fit.chi2:.1f} dof={fit.dof} p={fit.pvalue:.3g} (log10 p = {fit.log10_p:.1f}) TV={fit.tv:.4f}")
