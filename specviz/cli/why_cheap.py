"""`specviz why-cheap`: the Why checking is cheap lab's timings (pass cost and batch effect), printed or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specviz.cli.common import CliError, int_list, quiet_libraries, resolve_pair_name, stderr_progress


def add_why_cheap(sub: argparse._SubParsersAction) -> None:
    """The `why-cheap` subcommand's parser."""
    p = sub.add_parser(
        "why-cheap", help="time one target pass over 1..16 new tokens, and the batch effect on the speed-up",
        description="Time one target pass over 1..16 new tokens on a KV cache (the first measurement of the app's "
        "'Why checking is cheap' page), and the batch effect on speculative decoding's speed-up estimated from timed "
        "passes at each batch size (how the GPU figures were made; `specviz batch` measures it with real batched runs).",
    )
    p.add_argument("--pair", default=None, help="model pair (default: the project's default pair)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present, else cpu)")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per point, median reported (default 5)")
    # defaults None: the lab's own (importing the lab here would load torch for every command's --help)
    p.add_argument("--ks", type=int_list, default=None, help="new tokens per pass (default 1,2,4,8,16)")
    p.add_argument("--batches", type=int_list, default=None,
                   help="batch sizes (default 1,2,4,8; a GPU can take e.g. 1,2,4,8,16,32,64,128)")
    p.add_argument("--gamma", type=int, default=4, help="draft length γ of the batch effect (default 4)")
    p.add_argument("--no-batch", action="store_true", help="only the pass-cost measurement")
    p.add_argument("--note", default="", help="a line saved with the figures (where and how they were measured)")
    p.add_argument("--json", action="store_true", help="print one JSON object (save it as assets/verify_cost_gpu.json)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_why_cheap)


def cmd_why_cheap(args: argparse.Namespace) -> int:
    """Measure the pass cost (and, unless --no-batch, the batch effect) and print both."""
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.core.progress import drain
    from specviz.labs import why_cheap as lab

    try:
        pc_config = lab.PassCostConfig(ks=args.ks or lab.PASS_KS, repeats=args.repeats)
        b_config = lab.BatchConfig(gamma=args.gamma, batch_sizes=args.batches or lab.BATCH_SIZES, repeats=args.repeats)
    except ValueError as e:
        raise CliError(str(e)) from None
    pair = models.load_pair(pair_name, device=args.device, progress=stderr_progress(args.quiet))
    say = None if args.quiet else (lambda p: print(f"[{100 * p.fraction:3.0f}%] {p.message}", file=sys.stderr))
    out: dict[str, Any] = {"note": args.note}
    cost = drain(lab.measure_pass_cost(pair.target, pair.tokenizer, pair_name, pc_config), say)
    out["pass_cost"] = lab.pass_cost_to_dict(cost)
    if not args.no_batch:
        effect = drain(lab.measure_batch_effect(pair.target, pair.draft, pair.tokenizer, pair.eos_ids, pair_name,
                                                b_config), say)
        out["batch_effect"] = lab.batch_effect_to_dict(effect)
    if args.json:
        print(json.dumps(out, ensure_ascii=False, indent=1))
    else:
        print_why_cheap(out)
    return 0


def print_why_cheap(out: dict[str, Any]) -> None:
    """The why-cheap JSON as two small tables."""
    print_pass_cost(out["pass_cost"])
    if out.get("batch_effect"):
        print_batch_effect(out["batch_effect"])


def print_pass_cost(pc: dict[str, Any]) -> None:
    """One target pass's median time per number of new tokens, and its ratio to a one-token pass."""
    m = pc["machine"]
    print(f"{pc['pair']} on {m['device']} ({m['name']}, {m['threads']} threads), {pc['context_tokens']} tokens cached")
    print("new tokens   median ms   × one-token pass")
    for k, ms, x in zip(pc["ks"], pc["median_ms"], pc["ratio_to_one_token"]):
        print(f"{k:>10}   {ms:>9.1f}   {x:>6.2f}")


def print_batch_effect(be: dict[str, Any]) -> None:
    """Per batch size: a step's and a verification's time, their ratio, and the speed-up expected from them."""
    print(f"batch effect, γ = {be['gamma']}: α = {be['alpha']}, c = {be['c']}, "
          f"real speed-up at batch 1 = {be['run_speedup']}")
    print("batch   step ms   verify ms   verify ÷ step   expected speed-up")
    for p in be["points"]:
        print(f"{p['batch']:>5}   {p['step_median_ms']:>7.1f}   {p['verify_median_ms']:>9.1f}"
              f"   {p['verify_ratio']:>13.2f}   {p['expected_speedup']}")
    if be["stopped"]:
        print(be["stopped"])
