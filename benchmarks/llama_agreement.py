"""Our gguf target's first 32 greedy tokens beside llama.cpp's on the same file, for every preset: llama-agreement.md."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere: specviz is beside us

from specviz.bench import agreement, llama  # noqa: E402
from specviz.bench.report import cpu_flags_line  # noqa: E402
from specviz.bench.timing import cpu_model  # noqa: E402
from specviz.presets import PRESETS  # noqa: E402

PAIR = "qwen-coder"


def main(argv: list[str] | None = None) -> int:
    """Load the default pair at gguf, run llama-completion on each preset, compare, write the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (default 2)")
    parser.add_argument("--tokens", type=int, default=agreement.AGREE_TOKENS, help="greedy tokens compared (default 32)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "llama-agreement.md")
    args = parser.parse_args(argv)
    why = llama.why_no_peer(PAIR)
    if why:
        print(f"llama_agreement.py: {why}", file=sys.stderr)
        return 2
    from specviz import models

    pair = models.load_pair(PAIR, target_precision="gguf")
    rows = []
    with llama.peer_for(PAIR, args.threads) as peer:
        assert peer is not None
        for preset in PRESETS:
            run = peer.generate(preset.prompt, args.tokens)
            rows.append(agreement.compare(pair, preset.id, preset.prompt, run.text, args.tokens))
            print(f"[llama_agreement] {preset.id}: {agreement.verdict(rows[-1].parting)}", file=sys.stderr)
        version = peer.build.version
    header = [
        "# Is our 4-bit target the file's model? Our greedy text beside llama.cpp's",
        "",
        f"- machine: {cpu_model()} ({cpu_flags_line()}); date {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- ours: `{PAIR}` target at `gguf` ({pair.target_kernel}), the engine's cached one-token passes; "
        f"llama.cpp: {version}, `llama-completion --temp 0 -no-cnv -n {args.tokens}`, {args.threads} threads, the "
        "same GGUF file",
        f"- command: `python benchmarks/llama_agreement.py{' --tokens ' + str(args.tokens) if args.tokens != 32 else ''}`",
        "",
        "Where the texts part, the table gives llama.cpp's token's place in our logits and our logit gap between our "
        "token and theirs. Two valid orders of our own arithmetic (the engine's cached pass and transformers' plain "
        "forward over the whole prefix) give that gap twice: each engine rounds activations to 8 bits in its own way, "
        "so a gap of the size those two orders move it is a near-tie, not a bug. Anything else says look into it.",
    ]
    args.out.write_text(agreement.markdown(rows, header), encoding="utf-8")
    print(args.out.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
