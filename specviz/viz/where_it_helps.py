"""The "Where it helps" bars (speed-up and acceptance per workload, coloured by group) and its table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.viz.style import PLAIN_COLOUR, layout
from specviz.labs.where_it_helps import WorkloadResults, WorkloadRow

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler

# Okabe–Ito: bluish green for predictable text, reddish purple (and a hatch) for creative text
GROUP_STYLE: dict[str, tuple[str, str]] = {"predictable": ("#009E73", ""), "creative": ("#CC79A7", "/")}
OTHER_STYLE = ("#999999", ".")

WORDS: dict[str, dict[str, str]] = {
    "d1": {"speed": "how much sooner (× faster)", "acc": "guesses kept (%)", "x": "kind of writing",
           "none": "no gain", "predictable": "easy to guess", "creative": "hard to guess",
           "t_speed": "How much sooner", "t_acc": "How many guesses were kept"},
    "d2": {"speed": "speed-up (×)", "acc": "acceptance (% of drafted tokens)", "x": "workload",
           "none": "1× = no gain", "predictable": "predictable", "creative": "creative",
           "t_speed": "Speed-up over the target alone", "t_acc": "Acceptance rate"},
    "d5": {"speed": "speed-up (× wall time)", "acc": "α = accepted / drafted (%)", "x": "workload",
           "none": "1× = no gain", "predictable": "predictable", "creative": "creative",
           "t_speed": "Measured speed-up (target-only ms/token ÷ speculative ms/token)",
           "t_acc": "Acceptance rate α"},
}


def workload_bars(rows: Sequence[WorkloadRow], level: str = "d2", font_size: int = 13) -> go.Figure:
    """Two panels side by side: speed-up per workload with the 1× line, and acceptance per workload."""
    w = WORDS.get(level, WORDS["d2"])
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=(w["t_speed"], w["t_acc"]))
    titles = [r.title for r in rows]
    for group in dict.fromkeys(r.group for r in rows):
        colour, pattern = GROUP_STYLE.get(group, OTHER_STYLE)
        mine = [r for r in rows if r.group == group]
        name = w.get(group, group)
        for col, field, fmt, scale in ((1, "speedup", ".2f", 1.0), (2, "acceptance", ".0f", 100.0)):
            ys = [None if getattr(r, field) is None else getattr(r, field) * scale for r in mine]
            suffix = "×" if col == 1 else " %"
            fig.add_bar(x=[r.title for r in mine], y=ys, name=name, legendgroup=group, showlegend=col == 1,
                        marker=dict(color=colour, pattern_shape=pattern),
                        text=[("–" if y is None else f"{y:{fmt}}{suffix}") for y in ys], textposition="outside",
                        hovertemplate=f"%{{x}}: %{{y:{fmt}}}{suffix}<extra>{name}</extra>", row=1, col=col)
    fig.update_annotations(font_size=font_size)  # the subplot titles (before the 1× line adds its own)
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dash", width=1.5), row=1, col=1,
                  annotation_text=w["none"], annotation_position="top left",
                  annotation_font=dict(color="#555555", size=max(font_size - 2, 9)))
    top = max([1.3] + [r.speedup for r in rows if r.speedup is not None])
    fig.update_yaxes(title_text=w["speed"], range=[0, top * 1.2], ticksuffix="×", row=1, col=1)
    fig.update_yaxes(title_text=w["acc"], range=[0, 115], ticksuffix=" %", row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text=w["x"], categoryorder="array", categoryarray=titles, row=1, col=col)
    return layout(fig, 400, font_size, barmode="relative", margin=dict(l=10, r=10, t=50, b=10),
                  uniformtext_minsize=max(font_size - 3, 8), legend=dict(orientation="h", yanchor="bottom", y=1.08, x=0))


def workload_table(res: WorkloadResults, level: str) -> Styler:
    """One row per workload: speed-up, acceptance, tokens per round and both speeds (identity too at D5)."""
    rows = []
    for r in res.rows:
        row = {"workload": r.title, "group": r.group, "speed-up": r.speedup, "acceptance": r.acceptance,
               "tokens / round": r.tokens_per_round, "ms / token": r.ms_per_token,
               "target alone ms / token": r.baseline_ms_per_token}
        if level == "d5":
            row["same text as target alone"] = r.identical
        rows.append(row)
    fmt = {"speed-up": "{:.2f}×", "acceptance": "{:.0%}", "tokens / round": "{:.2f}", "ms / token": "{:.0f}",
           "target alone ms / token": "{:.0f}"}
    return pd.DataFrame(rows).style.format(fmt, na_rep="–")
