"""The "Which helper wins?" chart, table and verdict: each helper's speed-up, α, c and tokens per call on each preset."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from specviz.core import drafters
from specviz.labs import ranking
from specviz.labs.helpers import GAMMA, HelpersResult
from specviz.viz.chain_or_tree import preset_title
from specviz.viz.style import PLAIN_COLOUR, layout, span

COLOURS = {"model": "#0072B2", "ngram": "#999999", "eagle": "#009E73", "eagle-tree": "#D55E00"}
SHORT = {"d1": {"model": "small model", "ngram": "copying", "eagle": "big model's notes",
                "eagle-tree": "big model's notes, tree"},
         "d2": {"model": "draft model", "ngram": "prompt lookup", "eagle": "head (chain)", "eagle-tree": "head (tree)"},
         "d5": {"model": f"draft model, γ={GAMMA}", "ngram": "n-gram lookup", "eagle": f"EAGLE head, γ={GAMMA}",
                "eagle-tree": "EAGLE-2 tree"}}


def helper_name(helper: str, level: str) -> str:
    return SHORT.get(level, SHORT["d2"]).get(helper, drafters.spec(helper).title)


def helpers_figure(result: HelpersResult, level: str = "d2", font_size: int = 13) -> go.Figure:
    """Grouped bars: the measured speed-up of each helper (a bar) on each preset (a group)."""
    presets = result.config.presets
    fig = go.Figure()
    for helper in result.config.helpers:
        pts = [result.point(p, helper) for p in presets]
        ys = [p.speedup if p is not None else None for p in pts]
        if all(y is None for y in ys):
            continue
        fig.add_bar(x=[preset_title(p) for p in presets], y=ys, name=helper_name(helper, level),
                    marker_color=COLOURS.get(helper, PLAIN_COLOUR), texttemplate="%{y:.2f}×", textposition="outside",
                    hovertemplate="%{x}: %{y:.2f}×<extra>" + helper_name(helper, level) + "</extra>")
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot", width=1))
    title = "how much sooner (×)" if level == "d1" else "speed-up against the target alone (×)"
    fig.update_yaxes(title_text=title, rangemode="tozero", ticksuffix="×")
    fig.update_layout(barmode="group")
    return layout(fig, 420, font_size, margin=dict(l=10, r=10, t=30, b=10))


def helpers_table(result: HelpersResult, level: str = "d5") -> pd.DataFrame:
    """One row per preset and helper: α, c, tokens per target call, speed-up and whether greedy stayed identical."""
    rows = []
    for preset in result.config.presets:
        for helper in result.config.helpers:
            p = result.point(preset, helper)
            if p is None:
                continue
            rows.append({"prompt": preset_title(preset), "helper": helper_name(helper, level),
                         "α (accepted ÷ checked)": p.alpha, "c (guess cost ÷ target step)": p.c,
                         "tokens / target call": p.tokens_per_call, "speed-up": p.speedup,
                         "same tokens as the target": "–" if p.identical is None else ("✓" if p.identical else "✗")})
    # rounded as the page reads them: a raw 10.6667 in a cell said more than the run measured
    return pd.DataFrame(rows).round({"α (accepted ÷ checked)": 2, "c (guess cost ÷ target step)": 3,
                                     "tokens / target call": 2, "speed-up": 2})


def verdict(result: HelpersResult, level: str) -> str:
    """One line per preset: who won and by how much, or which helpers came out about the same (within the floor
    margin of one run each), computed from the runs (Markdown; no model text)."""
    lines = []
    for preset in result.config.presets:
        lead = result.leaders(preset)
        if not lead:
            continue
        best, title = lead[0], preset_title(preset)
        if len(lead) > 1:
            names = [helper_name(p.helper, level) for p in lead]
            lo, hi = min(p.speedup for p in lead), max(p.speedup for p in lead)  # type: ignore[type-var]
            lines.append(f"- **{title}:** the {' and the '.join(names)} were about as fast ({span(lo, hi, 1)} "
                         "times as fast): too close to name a winner." if level == "d1" else
                         f"- **{title}:** about the same: {' and '.join(names)} ({span(lo, hi, 2, '×')}, within "
                         f"{ranking.MIN_MARGIN:.0%} of each other).")
            continue
        name = helper_name(best.helper, level)
        if level == "d1":
            lines.append(f"- **{title}:** the fastest helper was the {name}: {best.speedup:.1f} times as fast.")
            continue
        detail = (f" (α {best.alpha:.2f}, c {best.c:.3f}, {best.tokens_per_call:.2f} tokens per target call)"
                  if best.alpha is not None and best.c is not None and best.tokens_per_call is not None else "")
        lines.append(f"- **{title}:** fastest: {name}, {best.speedup:.2f}×{detail}.")
    return "\n".join(lines)
