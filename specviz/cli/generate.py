"""`specviz generate`: one speculative run (and the target alone with --baseline), round by round or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from specviz.cli.common import (
    PROG, CliError, add_pair_arguments, add_sampling_arguments, add_tree_arguments, check_sampling_arguments,
    encoded_prompt, quiet_libraries, resolve_pair_name, stderr_progress, tree_config,
)
from specviz.core import drafters

if TYPE_CHECKING:  # these load torch: imported where a run needs them, never for --help
    from specviz.core.drafters.tree import TreeConfig
    from specviz.core.metrics import Comparison
    from specviz.core.trace import Generation, GenerationConfig

MAX_RUNS = 20  # --runs at most (each run is a whole generation)
WARMUP_TOKENS = 3  # tokens of the untimed warm-up run
WARMUP_PROMPT_TOKENS = 8  # the warm-up reads only this much of the prompt (a long prefill is not needed)


def add_generate(sub: argparse._SubParsersAction) -> None:
    """The `generate` subcommand's parser."""
    p = sub.add_parser(
        "generate", help="speculative generation on a model pair, shown round by round",
        description="Run speculative decoding once and print the text, every round and the totals.",
    )
    add_pair_arguments(p)
    add_sampling_arguments(p)
    add_tree_arguments(p)
    p.add_argument("--adaptive", action="store_true",
                   help="adaptive draft length: --gamma becomes the ceiling; the draft stops when unsure and "
                   "drafting switches off while it does not pay")
    p.add_argument("--baseline", action="store_true",
                   help="also run the target alone (same settings) and report the speed-up")
    p.add_argument("--runs", type=int, default=1,
                   help="runs of the same prompt in this one process, each drafting from the ones before when the "
                   "drafter remembers (suffix, hybrid); --json then prints {\"runs\": [one result per run]}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the human form")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """Check the arguments, load the pair, warm up, run (and the baseline), print."""
    check_sampling_arguments(args)
    if not 1 <= args.runs <= MAX_RUNS:
        raise CliError(f"--runs must be in 1..{MAX_RUNS}, got {args.runs}")
    quiet_libraries(args.quiet)  # before torch/transformers are imported (tqdm reads its env then)
    tree = tree_config(args)
    pair_name = resolve_pair_name(args.pair)
    progress = stderr_progress(args.quiet)
    from specviz import models
    from specviz.core.engine import autoregressive_generate, speculative_generate
    from specviz.core.metrics import compare
    from specviz.core.progress import drain

    from specviz.models import drafting, footprint

    config = generation_config(args)
    recorder, base_rss = footprint.Recorder(), footprint.rss()  # where the memory goes (--json's "memory")
    pair = models.load_pair(
        pair_name, draft_precision=args.draft_precision, progress=recorder.progress(progress),
        target_precision=args.target_precision
    )
    if not args.quiet:
        print(f"{PROG}: precision: target {getattr(pair, 'target_precision', '?')}, draft "
              f"{getattr(pair, 'draft_precision', '?')} ({getattr(pair, 'precision_reason', '')})",
              file=sys.stderr, flush=True)
    prompt_ids = encoded_prompt(pair, args.prompt, args.max_new_tokens)
    eos_ids = tuple(pair.eos_ids)
    memory, warm_memory = run_memories(args.drafter, pair)
    if (problem := drafting.why_not(args.drafter, pair)) is not None:
        raise CliError(f"--drafter {args.drafter}: {problem}", 1)
    drafter = drafting.resolve(args.drafter, pair, adaptive=args.adaptive, tree=tree, memory=memory)
    # the warm-up drafts from the datastore only: it must not become an "earlier run" the first timed run remembers
    warm_up(pair, drafting.resolve(args.drafter, pair, adaptive=args.adaptive, tree=tree, memory=warm_memory),
            prompt_ids, args.gamma)

    if not args.quiet:
        print(f"{PROG}: generating{' (then the baseline)' if args.baseline else ''}…", file=sys.stderr, flush=True)
    runs = [drain(speculative_generate(pair.target, drafter, pair.tokenizer, prompt_ids, config, eos_ids))
            for _ in range(args.runs)]
    recorder.mark("the speculative run" + ("s" if args.runs > 1 else ""))
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, prompt_ids, config, eos_ids)) if args.baseline else None
    if base is not None:
        recorder.mark("the baseline run")
    memory_use = footprint.footprint(recorder, footprint.pair_parts(pair), base_rss).to_dict()

    results = []
    for spec in runs:
        summary = compare(spec, base)
        result = run_dict(args, pair_name, pair, tree, prompt_ids, spec, summary)
        result["memory"] = memory_use
        if base is not None:
            result.update(baseline_dict(pair, prompt_ids, spec, base, summary))
        results.append(result)
    if args.json:
        print(json.dumps(results[0] if args.runs == 1 else {"runs": results}))
    else:
        for i, result in enumerate(results):
            if args.runs > 1:
                print(f"══ run {i + 1} of {args.runs}" + (" (drafting from the runs before)" if i and memory else "")
                      + " " + "═" * 40)
            print_human(result)
    return 0


def run_memories(drafter: str, pair: Any) -> tuple[Any, Any]:
    """For a drafter that remembers: this command's memory (its runs, the datastore) and the warm-up's (datastore only)."""
    if not drafters.spec(drafter).remembers:
        return None, None
    from specviz.core.memory import Memory, RunMemory, datastore, memory_for

    memory = memory_for(pair, visitor=RunMemory(datastore.vocab_size(pair)))
    return memory, Memory(datastore=memory.datastore)


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The run's GenerationConfig and SamplingConfig from the (already checked) flags."""
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig

    try:
        sampling = SamplingConfig(mode=args.mode, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed)
        return GenerationConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma, adaptive=args.adaptive,
                                sampling=sampling)
    except ValueError as e:  # the checks before should have caught it; keep the one-line promise anyway
        raise CliError(str(e)) from None


def warm_up(pair: Any, drafter: Any, prompt_ids: list[int], gamma: int) -> None:
    """An untimed run of a few tokens through the target and the drafter (hence the draft model).

    So the first timed run does not pay one-off costs (lazy kernel and allocator set-up, first touches of freshly
    loaded weights). The baseline then reuses the same, already warm target.
    """
    from specviz.core.engine import speculative_generate
    from specviz.core.progress import drain
    from specviz.core.trace import GenerationConfig

    warm_ids = prompt_ids[:WARMUP_PROMPT_TOKENS]
    warm_cfg = GenerationConfig(max_new_tokens=WARMUP_TOKENS, gamma=min(2, gamma), stop_at_eos=False)
    drain(speculative_generate(pair.target, drafter, pair.tokenizer, warm_ids, warm_cfg, tuple(pair.eos_ids)))


# ---------------------------------------------------------------------------------------------
# the JSON of a run: viz/export writes it (the rounds are the same records as the app's trace download)


def run_dict(args: argparse.Namespace, pair_name: str, pair: Any, tree: TreeConfig, prompt_ids: list[int],
             spec: Generation, summary: Comparison) -> dict[str, Any]:
    """What the run was asked (the flags, the pair's precisions), then viz/export's document of the run."""
    from specviz.viz.export import run_document

    asked = {
        "pair": pair_name,
        "mode": args.mode,
        "gamma": args.gamma,
        "adaptive": args.adaptive,
        "drafter": spec.drafter,
        "tree_config": {"budget": tree.budget, "branching": tree.branching, "depth": tree.depth}
        if drafters.spec(args.drafter).shape == "tree" else None,
        "draft_precision": getattr(pair, "draft_precision", None),
        "target_precision": getattr(pair, "target_precision", None),
        "precision_reason": getattr(pair, "precision_reason", None),
        "target_kernel": getattr(pair, "target_kernel", None),
        "draft_kernel": getattr(pair, "draft_kernel", None),
        "bit_exact": getattr(pair, "bit_exact", None),
        "device": str(getattr(pair, "device", "cpu")),
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "prompt": args.prompt,
        "prompt_tokens": len(prompt_ids),
    }
    return run_document(asked, spec, summary)


def baseline_dict(pair: Any, prompt_ids: list[int], spec: Generation, base: Generation,
                  summary: Comparison) -> dict[str, Any]:
    """The keys --baseline adds (viz/export's), with where a greedy run left the target's own text."""
    from specviz.core.divergence import divergence_with_gap
    from specviz.viz.export import baseline_document

    # only a run that parted from its baseline is looked at again (one more target pass over the text)
    d = divergence_with_gap(pair.target, prompt_ids, spec.tokens, base.tokens) if summary.identical is False else None
    return baseline_document(base, summary, d, lambda i: pair.tokenizer.decode([i]))


# ---------------------------------------------------------------------------------------------
# the human form, printed from the same JSON


def print_human(res: dict[str, Any]) -> None:
    """Text, one line per round, totals."""
    print("── text " + "─" * 60)
    print(res["prompt"] + res["text"])
    print(f"── rounds ({res['drafter']} drafter, γ={res['gamma']}, {res['mode']};"
          " ✓ accepted, ✗ rejected, · discarded) " + "─" * 8)
    for r in res["rounds"]:
        print(round_line(r))
    print("── totals " + "─" * 58)
    print_totals(res)
    if "baseline" in res:
        print_baseline(res)
    if res.get("target_precision"):
        print(f"precision: target {res['target_precision']}, draft {res['draft_precision']}"
              + ("" if res.get("bit_exact") else " (target not bit-exact here)")
              + (f"; kernels: target {res['target_kernel']}, draft {res['draft_kernel']}" if res.get("target_kernel") else ""))


def round_line(r: dict[str, Any]) -> str:
    """One round: what was drafted and its verdicts, the target's own token, and the round's timings."""
    return (f"{r['index'] + 1:4d}  {round_marks(r)}  → {_tok(r['next_text'])} ({r['next_origin']})"
            f"  draft {r['draft_ms']:.1f} ms, verify {r['verify_ms']:.1f} ms")


def round_marks(r: dict[str, Any]) -> str:
    """A round's drafted tokens, each marked ✓ accepted, ✗ the first rejection, · discarded after it (never checked)."""
    if r.get("tree"):
        nodes = r["tree"]["nodes"]
        path = " ".join(_tok(nodes[i]["text"]) + "✓" for i in r["tree"]["path"])
        count = {v: sum(1 for x in nodes if x["verdict"] == v) for v in ("rejected", "unreached")}
        return (f"tree of {len(nodes)}: {path or '(no branch kept)'}"
                f" [{count['rejected']} ✗ rejected, {count['unreached']} · unreached]")
    if r["draft_tokens"]:
        n = r["n_accepted"]
        return " ".join(_tok(t) + ("✓" if i < n else "✗" if i == n else "·") for i, t in enumerate(r["draft_texts"]))
    return "(no draft)"


def print_totals(res: dict[str, Any]) -> None:
    """Tokens, target calls, acceptance and the speculative run's speed."""
    drafted, alpha = res["acceptance_rate"], res["alpha_checked"]
    print(f"tokens: {len(res['tokens'])} (stop: {res['stop_reason']}) in {res['target_calls']} target calls"
          f" = {res['tokens_per_target_call']:.2f} tokens per target call")
    print(f"acceptance: {res['accepted']}/{res['drafted']} drafted"
          + (f" = {drafted:.2f}" if drafted is not None else "")
          + (f"; Leviathan's α (accepted ÷ checked) = {alpha:.2f}" if alpha is not None else ""))
    print(f"speculative: {res['ms_per_token']:.1f} ms/token (prefill {res['prefill_ms']:.0f} ms not counted)")


def print_baseline(res: dict[str, Any]) -> None:
    """The target alone: its speed, the speed-up (measured and expected), identity and any divergence."""
    b = res["baseline"]
    print(f"baseline (target alone): {b['ms_per_token']:.1f} ms/token")
    print(speedup_line(res))
    same = res["identical_to_baseline"]
    if same is not None:
        print(f"identical to baseline: {'yes' if same else 'NO'}")
    d = res.get("divergence")
    if d:
        print(f"first divergence at new token {d['position']}: speculative {_tok(d['speculative']['text'])}, "
              f"target alone {_tok(d['baseline']['text'])}; the target's top-2 logit gap there is "
              f"{'-' if d['top2_gap'] is None else format(d['top2_gap'], '.2g')} "
              f"(target precision {res.get('target_precision')} is not bit-exact here)")


def speedup_line(res: dict[str, Any]) -> str:
    """The measured speed-up, and the one expected from α, γ and c (and from the measured verify cost)."""
    sp, ex, c = res["speedup"], res["expected_speedup"], res["measured_c"]
    line = f"speed-up: {sp:.2f}x measured" if sp is not None else "speed-up: n/a"
    if ex is not None:
        line += f", {ex:.2f}x expected from α, γ and measured c = {c:.3f}"
    exv = res["expected_speedup_measured_verify"]
    if exv is not None:
        line += f" ({exv:.2f}x with the measured verify cost of {res['verify_steps']:.2f} target steps)"
    return line


def _tok(text: str) -> str:
    """A token's text as printed: quoted, with escapes."""
    return repr(text)
