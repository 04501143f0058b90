"""Time blockgemm on one matrix of each kind, 1, 5 and 16 rows, each row's blocks as stored against 16 rows side by side."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from anywhere: specviz is beside us

from specviz.models import blocks  # noqa: E402

SHAPES = (("Q4_K", 8960, 1536), ("Q4_K", 1536, 8960), ("Q6_K", 1536, 8960), ("Q5_0", 4864, 896), ("Q8_0", 4864, 896))


def median_ms(fn, n: int = 15) -> float:
    """Median of n timed calls after one warm-up (the matrices fit the cache: arithmetic, not memory)."""
    fn()
    times = sorted(_timed(fn) for _ in range(n))
    return times[n // 2]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    kern = blocks.kernel()
    if kern is None:
        raise SystemExit("blockgemm cannot be built here")
    print(f"blockgemm {kern.isa}, {torch.get_num_threads()} threads; ms for 1, 5, 16 rows")
    gen = torch.Generator().manual_seed(0)
    for name, n, k in SHAPES:
        qtype = blocks.TYPES[name]
        data = blocks.random_blocks(kern, qtype, n, k, gen)
        side = kern.x16(qtype, data, k)
        own, packed = [], []
        for rows in (1, 5, 16):
            x = torch.randn(rows, k)
            own.append(median_ms(lambda: kern.linear(qtype, data, k, x, None)))
            packed.append(median_ms(lambda: kern.linear_x16(qtype, side, n, k, x, None)))
        print(f"{name} {n}x{k}: as stored {' '.join(f'{v:.2f}' for v in own)} | "
              f"side by side {' '.join(f'{v:.2f}' for v in packed)}")


if __name__ == "__main__":
    main()
