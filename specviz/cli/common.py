"""What every command shares: the one-line refusal, argument groups, cheap checks and loading helpers."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specviz.core import drafters, limits  # plain Python: every check runs before torch is imported

if TYPE_CHECKING:  # loads torch: imported where a run needs it, never for --help
    from specviz.core.drafters.tree import TreeConfig

PROG = "specviz"
GAMMA_MIN, GAMMA_MAX = limits.GAMMA_RANGE
DEFAULT_GAMMA = limits.DEFAULT_GAMMA
# TreeConfig()'s defaults, written out: importing specviz.core.drafters.tree loads torch and transformers, and
# building the parser (every --help) must not (a test checks that they agree)
TREE_BUDGET, TREE_BRANCHING, TREE_DEPTH, TREE_MIN_SCORE = 24, 2, 12, 0.15


class CliError(Exception):
    """A refusal the user can fix: printed as ONE line `specviz: error: …`, exit `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


def print_error(message: str) -> None:
    """`specviz: error: …` as one line on stderr."""
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr, flush=True)


def int_list(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4) for argparse."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


# ---------------------------------------------------------------------------------------------
# argument groups


def add_pair_arguments(p: argparse.ArgumentParser) -> None:
    """--pair, --draft-precision and --quiet: every subcommand that loads models takes these."""
    p.add_argument(
        "--pair", default=None,
        help="model pair: a named pair (see README), hf:DRAFT_ID,TARGET_ID, or local folders "
        "DRAFT_DIR,TARGET_DIR (default: the project's default pair)",
    )
    add_precision_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress or library warnings on stderr")


def add_precision_arguments(p: argparse.ArgumentParser) -> None:
    """--target-precision and --draft-precision (default: chosen at load by a quick measurement)."""
    p.add_argument(
        "--target-precision", choices=limits.TARGET_PRECISIONS, default=None,
        help="precision of the target: gguf (a named GGUF pair on its file's own blocks, blockgemm), fp32 and fp16w "
        "(fp16 weights, fp32 arithmetic; CPUs with fbgemm) keep greedy "
        "output identical to the target alone; bf16 and int8 are smaller (and faster with native bf16 / int8) but not "
        "bit-exact (default: fp16w where it works and fp32 is not clearly faster here, else fp32 where it fits in memory)",
    )
    p.add_argument(
        "--draft-precision", choices=limits.DRAFT_PRECISIONS, default=None,
        help="precision of the draft model; never changes the output (default: gguf beside a gguf target, else the "
        "faster of int8 and bf16 measured here, fp32 for pairs int8 cannot cover)",
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The generation settings shared by generate and bench."""
    p.add_argument("--prompt", required=True, help="raw text to continue (no chat template)")
    p.add_argument("--mode", choices=limits.MODES, default="greedy", help="greedy (argmax) or sample")
    p.add_argument("--gamma", type=int, default=DEFAULT_GAMMA,
                   help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default {DEFAULT_GAMMA})")
    p.add_argument("--temperature", type=float, default=1.0, help="sample mode: > 0 (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of this request's random generator (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens at most (default 64)")
    p.add_argument("--drafter", choices=drafters.names(), default=drafters.DEFAULT,
                   help="; ".join(f"{d.name}: {d.title}" for d in drafters.specs()))


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """The shape of a drafted token tree (--drafter tree); defaults are TreeConfig's."""
    p.add_argument("--tree-budget", type=int, default=TREE_BUDGET,
                   help=f"nodes verified per round (default {TREE_BUDGET})")
    p.add_argument("--tree-branching", type=int, default=TREE_BRANCHING,
                   help=f"children per expanded node and nodes expanded per level (default {TREE_BRANCHING}; 1 = a chain)")
    p.add_argument("--tree-depth", type=int, default=TREE_DEPTH, help=f"longest branch (default {TREE_DEPTH})")
    p.add_argument("--tree-min-score", type=float, default=TREE_MIN_SCORE,
                   help=f"leave out nodes the draft rates below this path probability (default {TREE_MIN_SCORE}; 0 = none)")


# ---------------------------------------------------------------------------------------------
# checks, before any model loads


def tree_config(args: argparse.Namespace) -> TreeConfig:
    """The TreeConfig of --tree-* (a bad value is a one-line refusal, before any model loads; after quiet_libraries)."""
    from specviz.core.drafters.tree import TreeConfig

    try:
        return TreeConfig(budget=args.tree_budget, branching=args.tree_branching, depth=args.tree_depth,
                          min_score=args.tree_min_score)
    except ValueError as e:
        raise CliError(f"--{str(e).replace('tree ', 'tree-', 1)}") from None


def check_sampling_arguments(args: argparse.Namespace) -> None:
    """Cheap checks, run before any model is loaded."""
    if args.prompt:
        from specviz.settings import clean_prompt

        args.prompt, notes = clean_prompt(args.prompt)
        for note in notes:
            print(f"{PROG}: note: {note}", file=sys.stderr, flush=True)
    if not args.prompt or not args.prompt.strip():
        raise CliError("--prompt is empty: give some text to continue")
    check_flag("--gamma", limits.check_gamma, args.gamma)
    check_flag("--temperature", limits.check_temperature, args.mode, args.temperature)
    check_flag("--top-p", limits.check_top_p, args.top_p)
    check_flag("--top-k", limits.check_top_k, args.top_k)
    check_flag("--max-new-tokens", limits.check_max_new_tokens, args.max_new_tokens)


def check_flag(flag: str, check: Callable[..., None], *values: Any) -> None:
    """One of specviz.core.limits' checks, its refusal naming the flag the user typed."""
    try:
        check(*values)
    except ValueError as e:
        raise CliError(f"{flag}: {e}") from None


def resolve_pair_name(name: str | None) -> str:
    """The pair name, checked without loading anything (an unknown name is a bad argument)."""
    from specviz import models

    name = name or models.DEFAULT_PAIR
    try:
        models.get_spec(name)
    except models.PairError as e:
        raise CliError(str(e), 2) from None
    return name


# ---------------------------------------------------------------------------------------------
# loading


def quiet_libraries(quiet: bool) -> None:
    """Silence library progress bars (ours replace them); call before transformers is imported.

    The GGUF conversion's own tqdm bar is kept only on an interactive terminal without --quiet:
    it is the one finer-grained sign of life during a first load of a large model.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if quiet or not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")  # read when tqdm is first imported
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def stderr_progress(quiet: bool) -> Callable[[float, str], None] | None:
    """A `progress(fraction, message)` callback for models.load_pair that writes to stderr."""
    if quiet:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        warnings.simplefilter("ignore")
        return None

    def progress(fraction: float, message: str) -> None:
        print(f"{PROG}: [{100 * fraction:3.0f}%] {one_line(message)}", file=sys.stderr, flush=True)

    return progress


def encoded_prompt(pair: Any, prompt: str, max_new_tokens: int) -> list[int]:
    """The prompt's ids (settings.encode_prompt), refused in one line if empty or past the context."""
    from specviz.settings import encode_prompt

    ids = encode_prompt(pair.tokenizer, prompt)
    if not ids:
        raise CliError("the prompt encodes to no tokens")
    ctx = getattr(pair, "context_length", None)
    if ctx:
        if len(ids) >= ctx:
            raise CliError(f"the prompt is {len(ids)} tokens, too long for this pair's context of {ctx} tokens")
        if len(ids) + max_new_tokens > ctx:
            raise CliError(
                f"the prompt ({len(ids)} tokens) plus --max-new-tokens {max_new_tokens} exceeds this pair's "
                f"context of {ctx} tokens; use --max-new-tokens {ctx - len(ids)} or less"
            )
    return ids
