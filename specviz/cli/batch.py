"""`specviz batch`: B different prompts decoded together, target alone and speculative, for each batch size."""

from __future__ import annotations

import argparse
import json
import sys

from specviz.cli.common import (
    GAMMA_MAX, GAMMA_MIN, CliError, add_pair_arguments, check_flag, int_list, quiet_libraries, resolve_pair_name,
    stderr_progress,
)
from specviz.core import limits
from specviz.core.limits import DEFAULT_GAMMA


def add_batch(sub: argparse._SubParsersAction) -> None:
    """The `batch` subcommand's parser."""
    p = sub.add_parser(
        "batch", help="B different prompts decoded together (target alone, then speculative) for each batch size",
        description="For each batch size B, B different prompts (the presets first, then the load test's own) run "
        "together through the batched executor, once as target-only decoding and once as speculative decoding "
        "(the default drafter: the draft model's chain), greedy, side by side in one process. Tokens per second "
        "count all B runs' new tokens over the wall time; 'identical' says whether every run equalled the same "
        "run alone.",
    )
    add_pair_arguments(p)
    p.add_argument("--sizes", type=int_list, default=None, help="batch sizes, 1..16 (default 1,4,8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per run, 1..256 (default 32)")
    p.add_argument("--gamma", type=int, default=DEFAULT_GAMMA,
                   help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default {DEFAULT_GAMMA})")
    p.add_argument("--context", type=int, default=0,
                   help="make each prompt a different window of N tokens from one long document (default 0: short prompts)")
    p.add_argument("--repeats", type=int, default=1, help="measure each size this many times, 1..5 (default 1)")
    p.add_argument("--json", action="store_true", help='print {"sizes": [{"batch": B, "plain_tokens_per_s": ..., '
                   '"spec_tokens_per_s": ..., "identical": ...}, ...]} and more keys')
    p.set_defaults(func=cmd_batch)


def cmd_batch(args: argparse.Namespace) -> int:
    """Measure every batch size and print the table (or JSON); exit 1 if any run differed from itself alone."""
    check_flag("--gamma", limits.check_gamma, args.gamma)
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.bench import batch

    try:
        config = batch.BatchConfig(sizes=args.sizes or batch.SIZES, max_new_tokens=args.max_new_tokens,
                                   gamma=args.gamma, context=args.context, repeats=args.repeats)
    except ValueError as e:
        raise CliError(str(e)) from None
    pair = models.load_pair(pair_name, draft_precision=args.draft_precision, target_precision=args.target_precision,
                            progress=stderr_progress(args.quiet))
    say = (lambda _: None) if args.quiet else (lambda m: print(f"specviz: {m}", file=sys.stderr, flush=True))
    report = batch.measure_batches(pair, pair_name, config, say)
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=1))
    else:
        print(batch.sizes_table(report))
    return 0 if all(s.identical for s in report.sizes) else 1
