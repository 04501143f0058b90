"""Time the gguf target's pass over 1, 5 and 16 new rows through the engine's own forward, and the kernel's and attention's share."""

from __future__ import annotations

import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere: specviz is beside us

import specviz.core.lean as lean  # noqa: E402
from specviz.core import attend, forward as fw  # noqa: E402
from specviz.models import blocks, load_pair  # noqa: E402

PROMPT = "def fibonacci(n):\n    if n <= 1:\n        return n"
spent: collections.Counter[str] = collections.Counter()


def _timing(name: str, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        spent[name] += time.perf_counter() - start
        return out
    return timed


def mean_pass_ms(model, ids: list[int], rows: int, passes: int = 8) -> tuple[float, dict[str, float]]:
    """Mean ms of a pass over `rows` new tokens after the prompt's (each pass's rows dropped again), and its parts."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cpu = torch.device("cpu")
    fw.forward(model, [fw.Feed(model, cache, tuple(ids), tuple(range(len(ids))),
                               fw.causal_mask(0, len(ids), torch.float32, cpu), len(ids) - 1)])
    spent.clear()
    total = 0.0
    for _ in range(passes):
        feed = fw.Feed(model, cache, tuple([100] * rows), tuple(range(len(ids), len(ids) + rows)),
                       fw.causal_mask(len(ids), rows, torch.float32, cpu), 0)
        start = time.perf_counter()
        fw.forward(model, [feed])
        total += time.perf_counter() - start
        cache.crop(-rows)
    return total / passes * 1e3, {k: round(v / passes * 1e3, 1) for k, v in spent.items()}


def main() -> None:
    pair = load_pair("qwen-coder", target_precision="gguf", draft_precision="gguf")
    blocks.BlockKernel.linear_x16 = _timing("kernel", blocks.BlockKernel.linear_x16)
    lean.attend = _timing("attention", attend.attend)
    ids = pair.tokenizer(PROMPT)["input_ids"]
    for rows in (1, 5, 16):
        ms, parts = mean_pass_ms(pair.target, ids, rows)
        print(f"{rows:2d} rows: {ms:.1f} ms ({', '.join(f'{k} {v} ms' for k, v in parts.items())})")


if __name__ == "__main__":
    main()
