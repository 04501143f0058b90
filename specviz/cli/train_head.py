"""`specviz train-head`: train a pair's EAGLE-style draft head on its target's own continuations, and ship it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specviz.cli.common import CliError, quiet_libraries, resolve_pair_name


def add_train_head(sub: argparse._SubParsersAction) -> None:
    """The `train-head` subcommand's parser."""
    p = sub.add_parser(
        "train-head", help="train a pair's EAGLE-style draft head (record the target's continuations, train, ship)",
        description="Record the target's own sampled continuations of prompts found on this machine (the standard "
        "library's and the app's sources, openings in the presets' genres) with its last-layer features, choose the "
        "draft vocabulary from token counts, train the one-layer head, score it on held-out text and write it with its "
        "manifest (sha256, target, recipe, loss curve). Recorded chunks and checkpoints stay in the cache: run the same "
        "command again to resume.",
    )
    p.add_argument("--pair", default=None, help="the pair (default: the app's default pair)")
    p.add_argument("--prompts", type=int, default=400, help="prompts to record (default 400)")
    p.add_argument("--new-tokens", type=int, default=160, help="tokens the target adds to each prompt (default 160)")
    p.add_argument("--steps", type=int, default=1100, help="optimizer steps (default 1100)")
    p.add_argument("--batch", type=int, default=8, help="windows per step (default 8)")
    p.add_argument("--window", type=int, default=128, help="positions per window (default 128)")
    p.add_argument("--lr", type=float, default=5e-4, help="AdamW's peak learning rate (default 5e-4)")
    p.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up (default 50)")
    p.add_argument("--vocab", type=int, default=32768, help="draft vocabulary size (default 32768)")
    p.add_argument("--mlp", type=int, default=2048, help="the head's MLP width (default 2048)")
    p.add_argument("--record-precision", default="bf16", choices=("bf16", "fp32", "fp16w"),
                   help="the target's precision while recording (default bf16: fast on CPUs with bf16 units)")
    p.add_argument("--also-record", action="append", default=[], metavar="PROMPTS:SEED",
                   help="record this many more prompts with another seed and train on them too (repeatable; the first "
                   "recording's last chunk stays the held-out one, so a head can go on with more data)")
    p.add_argument("--text-tokens", type=int, default=0,
                   help="also read this many tokens of the datastore's code through the target (default 0)")
    p.add_argument("--unroll", type=int, default=1,
                   help="training-time test: unroll the head this many guesses on its own features (default 1: teacher forcing)")
    p.add_argument("--start-from", type=Path, default=None,
                   help="go on from the head in this folder (<pair>.safetensors and .json) instead of a fresh init")
    p.add_argument("--bf16", action="store_true", help="train in bfloat16 autocast (fast on CPUs with AMX)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts, the sampling, the head's init and the windows")
    p.add_argument("--out", type=Path, default=None, help="folder for the head and its manifest (default assets/heads)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_train_head)


def recipe_from(args: argparse.Namespace) -> object:
    from specviz.train.data import RecordConfig
    from specviz.train.head import TrainConfig
    from specviz.train.run import HeadRecipe

    for flag, value in (("--prompts", args.prompts), ("--new-tokens", args.new_tokens), ("--steps", args.steps),
                        ("--batch", args.batch), ("--window", args.window), ("--unroll", args.unroll), ("--vocab", args.vocab), ("--mlp", args.mlp)):
        if value < 1:
            raise CliError(f"{flag} must be at least 1, got {value}")
    if args.prompts < 2 * RecordConfig.chunk:
        raise CliError(f"--prompts must be at least {2 * RecordConfig.chunk}: one chunk of {RecordConfig.chunk} is held out")
    if args.text_tokens < 0:
        raise CliError(f"--text-tokens must be 0 or more, got {args.text_tokens}")
    if args.warmup < 0:
        raise CliError(f"--warmup must be 0 or more, got {args.warmup}")
    if not 0 < args.lr < 1:
        raise CliError(f"--lr must be between 0 and 1, got {args.lr}")
    return HeadRecipe(
        also_record=also_record(args),
        pair=resolve_pair_name(args.pair),
        record=RecordConfig(prompts=args.prompts, new_tokens=args.new_tokens, seed=args.seed),
        train=TrainConfig(steps=args.steps, lr=args.lr, window=args.window, batch=args.batch, seed=args.seed,
                          warmup=args.warmup, bf16=args.bf16, unroll=args.unroll),
        vocab=args.vocab, mlp=args.mlp, record_precision=args.record_precision, init_seed=args.seed,
        text_tokens=args.text_tokens, start_sha256=start_sha256(args))


def also_record(args: argparse.Namespace) -> tuple[object, ...]:
    """The further recordings --also-record names, each checked: PROMPTS:SEED, a seed no other recording uses."""
    from specviz.train.data import RecordConfig

    out, seeds = [], {args.seed}
    for text in args.also_record:
        prompts, _, seed = text.partition(":")
        try:
            cfg = RecordConfig(prompts=int(prompts), new_tokens=args.new_tokens, seed=int(seed))
        except ValueError:
            raise CliError(f"--also-record takes PROMPTS:SEED (two whole numbers), got {text!r}") from None
        if cfg.prompts < 1:
            raise CliError(f"--also-record {text}: record at least 1 prompt")
        if cfg.seed in seeds:  # the same seed draws the same prompts again
            raise CliError(f"--also-record {text}: seed {cfg.seed} is used by another recording; choose another")
        seeds.add(cfg.seed)
        out.append(cfg)
    return tuple(out)


def start_sha256(args: argparse.Namespace) -> str:
    """The sha256 of the head --start-from names (its manifest's), or "" for a fresh init."""
    if args.start_from is None:
        return ""
    from specviz.models import heads

    man = heads.manifest(resolve_pair_name(args.pair), args.start_from)
    if man is None:
        raise CliError(f"--start-from {args.start_from}: no head manifest for the pair there")
    return man["sha256"]


def cmd_train_head(args: argparse.Namespace) -> int:
    """Run (or resume) the whole training and print where the head went."""
    quiet_libraries(args.quiet)
    recipe = recipe_from(args)
    from tqdm import tqdm

    from specviz.train.run import train_head

    def report(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    def bar(**kw: object) -> tqdm:
        return tqdm(disable=args.quiet, file=sys.stderr, **kw)

    man = train_head(recipe, args.out, report, bar, args.start_from)
    held = man["held_out"]
    print(f"{recipe.pair}: head {man['file']} sha256 {man['sha256']} ({man['bytes'] / 1e6:.1f} MB); held-out sampled "
          f"acceptance {held['sampled_acceptance'][1]:.3f}, greedy agreement {held['greedy_agreement'][1]:.3f}")
    return 0
