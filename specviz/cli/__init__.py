"""The command line: `python -m specviz COMMAND …`; one module per command, shared helpers in common."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from specviz.cli import batch, bench, datastore, generate, loadtest, prepare, same_answer, train_head, why_cheap
from specviz.cli.common import PROG, CliError, print_error

COMMANDS = "generate, bench, loadtest, same-answer, why-cheap, batch, prepare, build-datastore or train-head"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (no usage dump) and never exits here."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message, 2)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (building it imports no torch: `--help` stays fast)."""
    parser = _Parser(prog=PROG, description="Speculative decoding on small model pairs, shown round by round.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    generate.add_generate(sub)
    bench.add_bench(sub)
    loadtest.add_loadtest(sub)
    same_answer.add_same_answer(sub)
    why_cheap.add_why_cheap(sub)
    batch.add_batch(sub)
    prepare.add_prepare(sub)
    datastore.add_build_datastore(sub)
    train_head.add_train_head(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; user errors are one stderr line (exit 2; 1 for a pair that won't load)."""
    try:
        sys.stdout.reconfigure(errors="replace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "func", None) is None:
            raise CliError(f"choose a command: {COMMANDS} (see python -m {PROG} -h)")
        return args.func(args)
    except CliError as e:
        print_error(str(e))
        return e.code
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except Exception as e:  # a pair that cannot be found or loaded is the user's to fix, not a bug
        models = sys.modules.get("specviz.models")
        if models is not None and isinstance(e, models.PairError):
            print_error(str(e))
            return 1
        raise
