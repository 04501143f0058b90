"""`specviz loadtest`: many browser-like sessions at once against a real app server."""

from __future__ import annotations

import argparse
import json
from typing import Any

from specviz.cli.common import CliError, resolve_pair_name
from specviz.core import drafters


def add_loadtest(sub: argparse._SubParsersAction) -> None:
    """The `loadtest` subcommand's parser."""
    p = sub.add_parser(
        "loadtest", help="many sessions at once against a real app server; latency percentiles and peak memory",
        description="Starts `streamlit run app.py`, opens N browser-like websocket sessions at once (each a "
        "different prompt, autoplay link), waits for each run and its baseline, downloads each JSON trace and "
        "checks its greedy tokens against a single-session reference. Prints latency percentiles and the "
        "server's peak memory.",
    )
    p.add_argument("--sessions", type=int, default=30, help="concurrent sessions, 1..200 (default 30)")
    p.add_argument("--pair", default="tiny-random", help="model pair (default tiny-random: tests the server, not the model)")
    p.add_argument("--max-new-tokens", type=int, default=24, help="new tokens per run, 1..256 (default 24)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a session may wait for its result (default 900)")
    p.add_argument("--class-mix", action="store_true",
                   help="a realistic class: half the sessions on the presets code, list and story (sessions on one "
                   "preset share one run), half on prompts of their own")
    p.add_argument("--drafter", choices=drafters.names(), default=drafters.DEFAULT, help="the drafter every session uses (default model; see `specviz "
                   "drafters`): suffix and hybrid remember, so each session's run is its own")
    p.add_argument("--class-memory", action="store_true",
                   help="start the server with class-wide memory on (remembering drafters draft from every session's runs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_loadtest)


def cmd_loadtest(args: argparse.Namespace) -> int:
    """Check the flags, run the load test, print its report; exit 1 unless every session was correct."""
    check_loadtest_arguments(args)
    pair = resolve_pair_name(args.pair)
    from specviz.bench import loadtest

    config = loadtest.LoadConfig(sessions=args.sessions, pair=pair, max_new_tokens=args.max_new_tokens,
                                 timeout_s=args.timeout, preset_share=0.5 if args.class_mix else 0.0,
                                 drafter=args.drafter, class_memory=args.class_memory)
    report = loadtest.run_loadtest(config).as_dict()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_loadtest(report)
    return 0 if report["passed"] == report["sessions"] else 1


def check_loadtest_arguments(args: argparse.Namespace) -> None:
    """The flags' ranges, refused in one line before any server starts."""
    if not 1 <= args.sessions <= 200:
        raise CliError(f"--sessions must be 1..200, got {args.sessions}")
    if not 1 <= args.max_new_tokens <= 256:
        raise CliError(f"--max-new-tokens must be 1..256, got {args.max_new_tokens}")
    if not args.timeout > 0:
        raise CliError("--timeout must be > 0 seconds")


def print_loadtest(report: dict[str, Any]) -> None:
    """The load test's report as a few lines: sessions, latency, the queue, memory, and every failure."""
    lat = report["latency_s"]
    memory = ", class-wide memory on" if report["class_memory"] else ""
    print(f"sessions: {report['passed']}/{report['sessions']} correct on {report['pair']} ({report['drafter']}{memory}) "
          f"in {report['wall_s']} s; "
          f"{report['on_presets']} on presets, {report['distinct_prompts']} distinct prompts")
    if report["runs_per_shared_prompt"]:
        print("runs serving each prompt several sessions asked for (1 = shared): " + ", ".join(
            f"{p!r} {n}" for p, n in report["runs_per_shared_prompt"].items()))
    print("latency (Play -> both runs done): " + ", ".join(f"{k} {v} s" for k, v in lat.items()))
    first = report["first_round_s"]
    print("first round on screen (Play -> its lane drawn): " + ", ".join(f"{k} {v} s" for k, v in first.items()))
    print(f"longest queue shown to a pupil: {report['max_queue_ahead_shown']} ahead; "
          f"'server busy' refusals (then reloaded): {report['refused_then_retried']}")
    rss = report["server_rss_mb"]
    print(f"server memory: {rss['start']} MB at start, {rss['peak']} MB peak")
    for line in report["failures"]:
        print("FAILED " + line)
