"""`specviz build-datastore`: tokenize the Python sources on this machine into a pair's datastore for the memory drafters."""

from __future__ import annotations

import argparse
import time

from specviz.cli.common import quiet_libraries, resolve_pair_name, stderr_progress


def add_build_datastore(sub: argparse._SubParsersAction) -> None:
    """The `build-datastore` subcommand's parser."""
    p = sub.add_parser(
        "build-datastore", help="build the memory drafters' datastore of a pair (the Python standard library's sources)",
        description="Tokenize the Python standard library's .py files on this machine with the pair's tokenizer "
        "(tests and GUI toolkits left out, files in sorted order) up to --max-tokens, and write them with a sha256 "
        "into the cache. The suffix and hybrid drafters search it; `prepare` builds it too.",
    )
    p.add_argument("--pair", default=None, help="the pair (default: the app's default pair)")
    p.add_argument("--max-tokens", type=int, default=None, help="the datastore's bound in tokens (default 1,000,000)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_build_datastore)


def cmd_build_datastore(args: argparse.Namespace) -> int:
    """Load the pair, build its datastore, check it by loading it back, print what it holds."""
    from specviz.cli.common import CliError

    if args.max_tokens is not None and args.max_tokens < 1:
        raise CliError("--max-tokens must be at least 1")
    quiet_libraries(args.quiet)
    name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.core.memory import datastore

    pair = models.load_pair(name, progress=stderr_progress(args.quiet))
    t0 = time.perf_counter()
    datastore.build(name, pair.tokenizer, datastore.vocab_size(pair),
                    max_tokens=args.max_tokens or datastore.MAX_TOKENS, progress=stderr_progress(args.quiet))
    datastore.load(name, pair.tokenizer, datastore.vocab_size(pair))  # the check a run makes
    print(datastore_line(name, time.perf_counter() - t0))
    return 0


def datastore_line(name: str, seconds: float) -> str:
    """One line: what the pair's datastore holds, and where."""
    from specviz.core.memory import datastore

    m = datastore.manifest(name) or {}
    return (f"{name}: datastore of {m.get('tokens', 0):,} tokens from {m.get('files', 0)} files of {m.get('source')} "
            f"(Python {m.get('python')}), sha256 {str(m.get('sha256'))[:12]}…, in {seconds:.1f} s "
            f"({datastore.folder(name)})")

