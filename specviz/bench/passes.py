"""The bench's pass costs: our target's pass over 1, 5 and 16 new tokens beside llama.cpp's on the same file, same run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specviz.bench import llama
from specviz.bench.methods import WORKLOADS_BY_NAME
from specviz.bench.timing import prefilled, timed_pass_ms
from specviz.settings import encode_prompt

PASS_ROWS = (1, 5, 16)  # a step, a γ = 4 check, a 16-token check
TG_TOKENS = 32  # llama-bench's one-row steps timed for its tg figure
CONTEXT = ("json", "code", "list")  # the cache the passes extend: these workloads' prompts, one after another


@dataclass(frozen=True)
class PassCosts:
    """One pass over k new tokens on a cache holding `context_tokens`, ours and (when present) llama.cpp's."""

    ks: tuple[int, ...]
    context_tokens: int
    ours_ms: tuple[float, ...]  # median of our repeats per k
    ours_weights: str  # the target's weight form and kernel ("gguf on blockgemm (avx512)")
    llama_ms: tuple[float, ...] | None = None  # llama-bench's mean per k, at the same depth
    llama_sd_ms: tuple[float, ...] | None = None
    llama_tg_ms: float | None = None  # llama-bench's ms per generated token
    llama_version: str = ""

    def steps(self, ms: Sequence[float]) -> tuple[float, ...]:
        """Each pass in one-token passes of the same engine."""
        return tuple(m / ms[self.ks.index(1)] for m in ms)


def our_passes(pair: Any, repeats: int) -> tuple[int, tuple[float, ...]]:
    """(tokens in the cache, median ms per k): each k once per round, a warm-up round first, on the engine's pass
    (bench.timing, as every run's passes), the cache cropped back after each."""
    ids = encode_prompt(pair.tokenizer, "".join(WORKLOADS_BY_NAME[w].prompt for w in CONTEXT))
    lm = prefilled(pair.target, ids)
    times: dict[int, list[float]] = {k: [] for k in PASS_ROWS}
    for r in range(repeats + 1):
        for k in PASS_ROWS:
            ms = timed_pass_ms(lm, [ids[i % len(ids)] for i in range(k)])
            if r:
                times[k].append(ms)
    return len(ids), tuple(statistics.median(times[k]) for k in PASS_ROWS)


def measure(pair: Any, peer: llama.LlamaPeer | None, repeats: int = 5) -> PassCosts:
    """Our passes (median of `repeats`), then llama-bench's at the same cache depth."""
    depth, ours = our_passes(pair, repeats)
    weights = f"{pair.target_precision} on {pair.target_kernel}" if pair.target_kernel else pair.target_precision
    costs = PassCosts(PASS_ROWS, depth, ours, weights)
    if peer is None:
        return costs
    records = llama.bench_records(peer.build, peer.target, peer.threads, PASS_ROWS, TG_TOKENS, depth=depth,
                                  repetitions=repeats)
    found = llama.pass_costs(records)
    mean_sd = [found["pass_ms"][k] for k in PASS_ROWS]
    return PassCosts(
        PASS_ROWS, depth, ours, weights,
        llama_ms=tuple(m for m, _ in mean_sd), llama_sd_ms=tuple(sd for _, sd in mean_sd),
        llama_tg_ms=found["tg_ms"][0] if found["tg_ms"] else None, llama_version=peer.build.version,
    )


def report_lines(p: PassCosts) -> list[str]:
    """The report's section: a table of both engines' passes in ms and in their own steps."""
    head = ["engine", *(f"{k} row{'s' * (k > 1)}" for k in p.ks)]
    lines = [
        "## One pass over k new tokens",
        "",
        f"Each engine's pass over 1, 5 and 16 new tokens with {p.context_tokens} tokens already in its cache, in ms "
        "and (in brackets) in its own one-token passes, measured after the runs above in the same process.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        _line(f"specviz, {p.ours_weights} (median of repeats)", p.ours_ms, p.steps(p.ours_ms)),
    ]
    if p.llama_ms is not None:
        lines.append(_line(f"{p.llama_version}, `llama-bench -d {p.context_tokens}` (mean)", p.llama_ms,
                           p.steps(p.llama_ms)))
        lines += ["", f"llama.cpp's tg (one token while generating, `llama-bench -n {TG_TOKENS}`): "
                  f"{p.llama_tg_ms:.1f} ms." if p.llama_tg_ms else ""]
    return lines


def _line(name: str, ms: Sequence[float], steps: Sequence[float]) -> str:
    return "| " + " | ".join([name, *(f"{m:.1f} ms ({s:.2f})" for m, s in zip(ms, steps))]) + " |"
