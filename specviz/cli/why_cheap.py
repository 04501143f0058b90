"""`specviz why-cheap`: the Why checking is cheap lab's pass-cost timing, printed or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specviz.cli.common import PROG, CliError, int_list, quiet_libraries, resolve_pair_name, stderr_progress


def add_why_cheap(sub: argparse._SubParsersAction) -> None:
    """The `why-cheap` subcommand's parser."""
    p = sub.add_parser(
        "why-cheap", help="time one target pass over 1..16 new tokens on a KV cache",
        description="Time one target pass over 1..16 new tokens on a KV cache (the first measurement of the app's "
        "'Why checking is cheap' page). The batch effect on the speed-up is measured by `specviz batch`, with real "
        "batched runs.",
    )
    p.add_argument("--pair", default=None, help="model pair (default: the project's default pair)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present, else cpu)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per point, median reported (default 5)")
    # defaults None: the lab's own (importing the lab here would load torch for every command's --help)
    p.add_argument("--ks", type=int_list, default=None, help="new tokens per pass (default 1,2,4,8,16)")
    # the timed-pass batch estimate these named is gone: say where the batch effect is measured now
    for gone in ("--batches", "--gamma", "--no-batch"):
        p.add_argument(gone, nargs="?", const=True, default=None, dest=f"gone_{gone[2:].replace('-', '_')}",
                       help=argparse.SUPPRESS)
    p.add_argument("--compare-kernels", action="store_true",
                   help="also time whole passes through fbgemm (the kernel before rowgemm) on a copy of the target's "
                   "linears, turn about with the loaded kernel in the same run (about 3 GB more for the Qwen target)")
    p.add_argument("--compare-precisions", action="store_true",
                   help="time the target at its GGUF file's own blocks (gguf) and with fp16 weights (fp16w) turn about "
                   "in one run; --json then holds 'precisions': {'gguf': {'ks', 'median_ms'}, 'fp16w': {...}} "
                   "(named GGUF pairs; both targets in memory: about 4.5 GB for the Qwen pair)")
    p.add_argument("--note", default="", help="a line saved with the figures (where and how they were measured)")
    p.add_argument("--json", action="store_true", help="print one JSON object (save it as assets/verify_cost_gpu.json)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_why_cheap)


def cmd_why_cheap(args: argparse.Namespace) -> int:
    """Measure the pass cost and print it."""
    gone = [name for name in ("batches", "gamma", "no_batch") if getattr(args, f"gone_{name}") is not None]
    if gone:
        raise CliError(f"why-cheap no longer estimates the batch effect (--{gone[0].replace('_', '-')}): "
                       f"`python -m {PROG} batch --pair PAIR` measures it with real batched runs")
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.core.progress import drain
    from specviz.labs import why_cheap as lab

    try:
        pc_config = lab.PassCostConfig(ks=args.ks or lab.PASS_KS, repeats=args.repeats)
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.compare_precisions and args.compare_kernels:
        raise CliError("--compare-precisions and --compare-kernels each time two targets: ask for one")
    precision = "gguf" if args.compare_precisions else None
    pair = models.load_pair(pair_name, device=args.device, progress=stderr_progress(args.quiet),
                            target_precision=precision, draft_precision=precision)
    say = None if args.quiet else (lambda p: print(f"[{100 * p.fraction:3.0f}%] {p.message}", file=sys.stderr))
    out: dict[str, Any] = {"note": args.note, "target_kernel": pair.target_kernel, "draft_kernel": pair.draft_kernel}
    targets = {pair_name: pair.target}
    if args.compare_kernels:
        twin = lab.fbgemm_twin(pair.target)
        if twin is None:
            raise CliError(f"--compare-kernels needs a target on rowgemm and fbgemm's fp16 kernels here; "
                           f"{pair_name}'s target runs on {pair.target_kernel}")
        targets[f"{pair_name} on fbgemm"] = twin
    if args.compare_precisions:  # the same file's model with fp16 weights, timed turn about with the gguf one
        half = models.load_pair(pair_name, device=args.device, progress=stderr_progress(args.quiet),
                                target_precision="fp16w")
        targets[f"{pair_name} fp16w"] = half.target
        out["fp16w_target_kernel"] = half.target_kernel
    costs = drain(lab.measure_pass_costs(targets, pair.tokenizer, pc_config), say)
    out["pass_cost"] = lab.pass_cost_to_dict(costs[0])
    if args.compare_precisions:
        out["precisions"] = {name: {"kernel": kernel, "ks": list(c.ks), "median_ms": [round(m, 3) for m in c.median_ms],
                                    "ratio_to_one_token": [round(r, 3) for r in c.ratios]}
                             for name, kernel, c in (("gguf", pair.target_kernel, costs[0]),
                                                     ("fp16w", out["fp16w_target_kernel"], costs[1]))}
    elif len(costs) > 1:
        out["fbgemm_pass_cost"] = lab.pass_cost_to_dict(costs[1])
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=1))
        return 0
    print(f"kernels: target {pair.target_kernel}, draft {pair.draft_kernel}")
    print_pass_cost(out["pass_cost"])
    if "fbgemm_pass_cost" in out:
        print()
        print_pass_cost(out["fbgemm_pass_cost"])
    if "precisions" in out:
        for name, figures in out["precisions"].items():
            steps = ", ".join(f"{k}: {ms:.1f} ms ({r:.2f} steps)" for k, ms, r in
                              zip(figures["ks"], figures["median_ms"], figures["ratio_to_one_token"]))
            print(f"{name} ({figures['kernel']}): {steps}")
    return 0


def print_pass_cost(pc: dict[str, Any]) -> None:
    """One target pass's median time per number of new tokens, and its ratio to a one-token pass."""
    m = pc["machine"]
    print(f"{pc['pair']} on {m['device']} ({m['name']}, {m['threads']} threads), {pc['context_tokens']} tokens cached")
    print("new tokens   median ms   × one-token pass")
    for k, ms, x in zip(pc["ks"], pc["median_ms"], pc["ratio_to_one_token"]):
        print(f"{k:>10}   {ms:>9.1f}   {x:>6.2f}")

