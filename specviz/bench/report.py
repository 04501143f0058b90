"""The benchmark's reports: bench-<pair>.csv, the Markdown table with its header and notes, the speed-up figure."""

from __future__ import annotations

import datetime as dt
import html
import os
import platform
import re
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specviz.bench.harness import BASELINE, CSV_COLUMNS, METHODS, SAMPLE_TEMPERATURE, BenchConfig, BenchRow, method_order
from specviz.bench import passes
from specviz.bench.profile import ProfileRow, report_lines
from specviz.bench.timing import cpu_model


def safe_name(pair: str) -> str:
    """A pair name as a file-name part ('hf:a/b,c/d' -> 'hf_a_b_c_d')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", pair).strip("_") or "pair"


def cpu_flags_line() -> str:
    """The vector instruction sets the CPU reports (what the kernels were built for), e.g. "avx2 fma f16c avx512f"."""
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    found = [w for w in wanted if w in flags]
    return " ".join(found) if found else "not reported"


def machine_line(device: str) -> str:
    import transformers

    gpu = ""
    if device.startswith("cuda") and torch.cuda.is_available():
        gpu = f", GPU {torch.cuda.get_device_name(0)}"
    return (f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} cores{gpu}; "
            f"torch {torch.__version__}, transformers {transformers.__version__}; device {device}")


def rows_frame(rows: Sequence[BenchRow]) -> Any:
    import pandas as pd

    # one cell per row for the per-position acceptances: "0.97 0.91 0.80" (k = 1, 2, 3, …)
    records = [{**asdict(r), "acceptance_by_position": position_cell(r.acceptance_by_position)} for r in rows]
    return pd.DataFrame(records, columns=list(CSV_COLUMNS))


def position_cell(shares: Sequence[float]) -> str:
    """Per-position acceptances as one CSV cell, space-separated, two decimals (empty without a drafter)."""
    return " ".join(f"{x:.2f}" for x in shares)


def _fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    if x is None:
        return ""
    return f"{x:.{digits}f}{suffix}"


def _yes(x: bool | None) -> str:
    return "" if x is None else ("yes" if x else "**NO**")


TABLE_HEADER = ("workload", "mode", "method", "ms/token", "tokens/s", "speed-up", "accepted/drafted", "α (checked)",
                "tokens/target call", "c", "expected", "expected (measured verify)", "on an H200 (estimate)", "γ",
                "peak RSS MB", "= target", "= hf-plain", "= llama.cpp")


def markdown_table(rows: Sequence[BenchRow]) -> str:
    """The rows as one GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "|".join("---" for _ in TABLE_HEADER) + "|"]
    for r in rows:
        cells = (
            f"{r.workload} ({r.kind})" if r.kind else r.workload, r.mode, f"`{r.method}`",
            _fmt(r.ms_per_token, 1), _fmt(r.tokens_per_s, 2), _fmt(r.speedup, 2, "×"),
            _fmt(r.acceptance_rate, 2), _fmt(r.alpha_checked, 2), _fmt(r.tokens_per_target_call, 2), _fmt(r.c, 3),
            _fmt(r.expected_speedup, 2, "×"), _fmt(r.expected_speedup_measured_verify, 2, "×"),
            _fmt(r.gpu_expected, 2, "×"), _fmt(r.gamma, 1),
            _fmt(r.peak_rss_mb, 0),
            _yes(r.identical_to_baseline), _yes(r.identical_to_hf_plain), _yes(r.identical_to_llama_plain),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _hf_assisted_note() -> str:
    try:
        from transformers.utils import is_sklearn_available

        tuned = is_sklearn_available()
    except ImportError:
        tuned = False
    return ("transformers' defaults: up to 20 draft tokens per round, the draft stops below confidence 0.4"
            + ("; the threshold is re-tuned during the run (scikit-learn is installed)" if tuned
               else "; no re-tuning of that threshold (it needs scikit-learn, not installed)"))


def _llama_note() -> str:
    from specviz.bench import llama

    build = llama.find_build()
    return (f"{build.version if build else 'llama.cpp'}, built for this CPU by `benchmarks/llama_cpp.py`, run on the "
            "pair's own GGUF files with our thread count, greedy only; its own timers (prompt pass, then decoding and "
            "sampling; model load excluded) give ms/token; its text is read back into ids by the pair's tokenizer "
            "(it prints text, not ids) and cut at the run's new tokens. accepted/drafted is llama-speculative-"
            "simple's n_accept / n_drafted. = target: that text equals our target alone's; = llama.cpp: a speculative "
            "row's text equals llama.cpp's own plain text. c and α are not observable from its output (blank).")


def markdown_report(config: BenchConfig, pair: Any, pair_name: str, rows: Sequence[BenchRow], date: str,
                    profiles: Sequence[ProfileRow] = (), costs: passes.PassCosts | None = None) -> str:
    """The whole bench-<pair>.md: header (machine, date, command, settings), table, footnotes."""
    device = str(getattr(pair, "device", config.device or "cpu"))
    title = getattr(getattr(pair, "spec", None), "title", pair_name)
    used = [m for m in METHODS if m.name in {r.method for r in rows}]
    lines = [
        f"# specviz bench: {title} (`{pair_name}`)",
        "",
        f"- machine: {machine_line(device)}",
        f"- date: {date}",
        f"- command: `{config.command or 'python -m specviz bench'}`",
        f"- settings: {config.repeats} repeats (interleaved: each repeat runs every method once), "
        f"{config.max_new_tokens} new tokens at most, modes {', '.join(config.modes)}"
        + (f" (sample = T {config.temperature}, top-k off, top-p 1)" if "sample" in config.modes else "")
        + ", draft precision "
        f"{getattr(pair, 'draft_precision', config.draft_precision or 'default')}, "
        f"target precision {getattr(pair, 'target_precision', config.target_precision or 'default')}, "
        f"a {config.warmup_tokens}-token untimed warm-up per method before each workload and mode",
        f"- kernels: target {getattr(pair, 'target_kernel', '') or 'not recorded'}, "
        f"draft {getattr(pair, 'draft_kernel', '') or 'not recorded'}; CPU flags: {cpu_flags_line()}",
        "",
        markdown_table(rows),
        "",
        "Notes:",
        "- ms/token = (prefill + decode wall time) / new tokens for every method, median over the repeats; "
        "transformers' generate is timed as one call, so its prefill is in its figure and ours is counted the same way. "
        "tokens/s = 1000 / that median.",
        "- speed-up = median ms/token of `target` (ours, target alone) / median ms/token of the method, in the same run.",
        "- accepted/drafted counts the guesses after a rejection as misses; α (checked) = accepted / (accepted + first "
        "rejections) is Leviathan et al.'s α. c = median per-round draft ms per drafted token / one target step (median "
        "step of the `target` run of the same repeat); expected = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) from the median "
        "α (checked), γ and c, which assumes a verify pass costs one target step; expected (measured verify) puts the "
        "verify pass's measured cost in target steps in place of that 1 (median over repeats). γ is the configured "
        "draft length, or for `spec-adaptive`, `eagle-adaptive` and `ngram` the mean number drafted per drafting round; for `spec-tree` the "
        "drafted are all tree nodes, γ the mean nodes per tree and c the draft ms per node; the chain formula does not "
        "describe a tree, so its expected columns are blank: read its tokens per target call. These figures "
        "come from specviz.core.metrics.compare and are not observable for transformers' methods (blank).",
        "- on an H200 (estimate; qwen-coder only): this run's rounds replayed at the step and pass costs measured on a "
        "lent NVIDIA H200 with random weights in these shapes (`assets/head_cost_gpu.json`, bf16): each round costs its "
        "sequential draft calls (a tree: one per level) and one verify pass, against one target step per token. The "
        "acceptance is this run's, on real weights; the costs are the GPU's; no run was made on the GPU.",
        "- acceptance by position (CSV column `acceptance_by_position`, k = 1, 2, …): the share of drafting rounds "
        "whose k-th drafted token was accepted (vLLM's per-position counters; a round that drafted fewer than k, or "
        "stopped before k, is a miss at k; for a tree, the k-th token of its accepted path), median over the repeats.",
        "- = target / = hf-plain (greedy only): every repeat produced exactly the same tokens as ours target-only / "
        "transformers' plain generate.",
        "- peak RSS = the process's VmHWM during the run (reset before each run), highest over the repeats; "
        "the loaded models dominate it.",
        "- methods: " + "; ".join(f"`{m.name}` {m.description}" for m in used) + ".",
    ]
    if any(m.assistant for m in used):
        lines.append(f"- `hf-assisted`: {_hf_assisted_note()}.")
    if any(m.family == "llama" for m in used):
        lines.append(f"- llama.cpp's rows: {_llama_note()}")
    if profiles:
        lines += ["", *report_lines(profiles)]
    if costs is not None:
        lines += ["", *passes.report_lines(costs)]
    return "\n".join(lines) + "\n"


def speedup_figure(rows: Sequence[BenchRow], pair_name: str, device: str) -> Any:
    """Grouped bars: speed-up over target-only per workload (x) and method (colour), one panel per mode."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    modes = list(dict.fromkeys(r.mode for r in rows))
    workloads = list(dict.fromkeys(r.workload for r in rows))
    methods = [m for m in dict.fromkeys(r.method for r in rows) if m != BASELINE]
    methods.sort(key=method_order)
    fig = make_subplots(rows=len(modes), cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[f"{m}" + (f" (T {SAMPLE_TEMPERATURE})" if m == "sample" else "") for m in modes])
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
    for i, mode in enumerate(modes, start=1):
        for j, method in enumerate(methods):
            by_wl = {r.workload: r for r in rows if r.mode == mode and r.method == method}
            fig.add_trace(go.Bar(
                x=workloads,
                y=[by_wl[w].speedup if w in by_wl else None for w in workloads],
                name=method, legendgroup=method, showlegend=i == 1,
                marker_color=palette[j % len(palette)],
                customdata=[[_fmt(by_wl[w].ms_per_token, 1) if w in by_wl else ""] for w in workloads],
                hovertemplate=f"{html.escape(method)}<br>%{{x}}: %{{y:.2f}}× (%{{customdata[0]}} ms/token)<extra></extra>",
            ), row=i, col=1)
        fig.add_hline(y=1.0, line_dash="dash", line_color="black", row=i, col=1,
                      annotation_text="target alone = 1.0", annotation_position="top left")
        fig.update_yaxes(title_text="speed-up vs target-only (×)", rangemode="tozero", row=i, col=1)
    fig.update_xaxes(title_text="workload", row=len(modes), col=1)
    fig.update_layout(
        title=f"specviz bench: speed-up over target-only decoding, {pair_name} on {device} "
              "(median ms/token ratio, prefill included)",
        barmode="group", template="plotly_white", height=380 * len(modes) + 120, legend_title_text="method",
    )
    return fig


def write_reports(config: BenchConfig, pair: Any, pair_name: str, rows: Sequence[BenchRow],
                  profiles: Sequence[ProfileRow] = (), costs: passes.PassCosts | None = None) -> dict[str, Path]:
    """bench-<pair>.csv, .md and .html into config.out_dir; returns their paths."""
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench-{safe_name(pair_name)}"
    date = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    paths = {"csv": stem.with_suffix(".csv"), "md": stem.with_suffix(".md"), "html": stem.with_suffix(".html")}
    rows_frame(rows).to_csv(paths["csv"], index=False)
    paths["md"].write_text(markdown_report(config, pair, pair_name, rows, date, profiles, costs), encoding="utf-8")
    device = str(getattr(pair, "device", config.device or "cpu"))
    speedup_figure(rows, pair_name, device).write_html(paths["html"], include_plotlyjs="cdn", full_html=True)
    return paths
