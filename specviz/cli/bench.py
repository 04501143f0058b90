"""`specviz bench`: ours against transformers' assisted and plain generation, written to CSV, Markdown and HTML."""

from __future__ import annotations

import argparse
import shlex
import sys

from specviz.cli.common import PROG, CliError, add_precision_arguments, quiet_libraries, resolve_pair_name, stderr_progress


def add_bench(sub: argparse._SubParsersAction) -> None:
    """The `bench` subcommand's parser (its help is written out: parsing must not import the harness's torch)."""
    p = sub.add_parser(
        "bench", help="benchmark ours vs transformers' assisted and plain generation",
        description="Interleaved side-by-side benchmark on fixed workloads; writes bench-<pair>.csv/.md/.html "
        "and prints the Markdown table. Progress goes to stderr.",
    )
    p.add_argument("--pair", action="append", default=None,
                   help="model pair (repeatable; default: qwen-coder and smollm2-135m, or qwen-coder with --quick)")
    add_precision_arguments(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="run everything (ours and transformers') on this device (default: cuda when present)")
    p.add_argument("--quick", action="store_true",
                   help="about 10-20 minutes on a 2-core CPU: greedy, code/list/story, 32 tokens, "
                   "target/spec-g4/spec-adaptive/spec-tree/hf-plain/hf-assisted/ngram/suffix/hybrid/eagle/eagle-adaptive/eagle-tree/"
                   "llama.cpp/llama.cpp-spec-g4/llama.cpp-spec-g16 (llama.cpp's where benchmarks/llama_cpp.py built it)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per method, >= 3 (default 3); medians are shown")
    p.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per run (default 64; 32 with --quick)")
    p.add_argument("--workloads", default=None, help="comma-separated: code,json,list,copy,story,poem")
    p.add_argument("--modes", default=None,
                   help="comma-separated: greedy,sample (sample: T 0.7; default both, greedy with --quick)")
    p.add_argument("--methods", default=None,
                   help="comma-separated: target,spec-g2,spec-g4,spec-g8,spec-adaptive,spec-tree,hf-plain,"
                   "hf-assisted,hf-lookup,ngram,suffix,hybrid,eagle,eagle-adaptive,eagle-tree,llama.cpp,llama.cpp-spec-g4,"
                   "llama.cpp-spec-g16 (target always runs: it is the baseline; the eagle methods need a pair that ships a "
                   "head; llama.cpp's run greedy, on a pair of packaged GGUF files, where its build is in the cache)")
    p.add_argument("--out", default="benchmarks", help="output folder (default benchmarks/)")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the round profile (one extra run of each of our methods with lap timers on)")
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress or library warnings on stderr")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark, write its reports and print each pair's Markdown table."""
    pairs = [resolve_pair_name(name) for name in args.pair] if args.pair else None
    quiet_libraries(args.quiet)  # before torch/transformers are imported (tqdm reads its env then)
    progress = stderr_progress(args.quiet)
    from specviz.bench import harness as bench
    from specviz.bench import report

    try:
        config = bench.make_config(
            pairs=pairs, quick=args.quick, workloads=args.workloads, methods=args.methods, repeats=args.repeats,
            max_new_tokens=args.max_new_tokens, out_dir=args.out, device=args.device,
            draft_precision=args.draft_precision, command=f"python -m {PROG} {shlex.join(sys.argv[1:])}",
            target_precision=args.target_precision, modes=args.modes, profile=args.profile,
        )
        results = bench.run_bench(config, report.write_reports, progress=progress)
    except bench.BenchError as e:
        raise CliError(str(e)) from None
    for _, _, paths in results:
        print(paths["md"].read_text(encoding="utf-8"))
    return 0
