"""The "Chain or tree?" chart and table: tokens per target call and speed-up against the verified tokens per pass."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.labs.chain_or_tree import SHAPES, ShapeResult
from specviz.presets import get_preset
from specviz.viz.style import ACC_COLOUR, PLAIN_COLOUR, SPEED_COLOUR, layout

COLOURS = {"chain": SPEED_COLOUR, "tree": ACC_COLOUR}
DASH = {"chain": "dash", "tree": "solid"}

WORDS: dict[str, dict[str, str]] = {
    "d1": {"x": "guesses checked in one turn", "tokens": "words per big-model turn", "speed": "how much sooner (×)",
           "chain": "one line of guesses", "tree": "a tree of guesses"},
    "d2": {"x": "guessed tokens checked per pass", "tokens": "tokens per target call", "speed": "speed-up (×)",
           "chain": "chain (γ = n)", "tree": "tree (n nodes)"},
    "d5": {"x": "n = drafted tokens verified per pass", "tokens": "tokens / target call", "speed": "speed-up (× wall time)",
           "chain": "chain, γ = n", "tree": "tree, budget n, branching 2, depth ≤ n"},
}


def preset_title(preset: str) -> str:
    """"Code (predictable)": a column's title."""
    p = get_preset(preset)
    return f"{p.title} ({p.group})" if p is not None else preset


def shape_figure(result: ShapeResult, level: str = "d2", font_size: int = 13) -> go.Figure:
    """Two rows (tokens per target call; measured speed-up) by one column per preset; a line per shape."""
    w = WORDS.get(level, WORDS["d2"])
    presets = result.config.presets
    fig = make_subplots(rows=2, cols=len(presets), shared_xaxes=True, vertical_spacing=0.1, horizontal_spacing=0.08,
                        column_titles=[preset_title(p) for p in presets])
    for col, preset in enumerate(presets, start=1):
        for shape in SHAPES:
            pts = [result.point(preset, n, shape) for n in result.config.sizes]
            pts = [p for p in pts if p is not None]
            for row, field, fmt in ((1, "tokens_per_call", ".2f"), (2, "speedup", ".2f")):
                xs = [p.size for p in pts if getattr(p, field) is not None]
                ys = [getattr(p, field) for p in pts if getattr(p, field) is not None]
                fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=w[shape], legendgroup=shape,
                                showlegend=col == 1 and row == 1, row=row, col=col,
                                line=dict(color=COLOURS[shape], dash=DASH[shape], width=2.5), marker=dict(size=9),
                                hovertemplate=f"n = %{{x}}: %{{y:{fmt}}}<extra>{w[shape]}</extra>")
        fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot", width=1), row=2, col=col)
        fig.update_xaxes(title_text=w["x"], tickvals=list(result.config.sizes), row=2, col=col)
        fig.update_xaxes(tickvals=list(result.config.sizes), row=1, col=col)
        fig.update_yaxes(title_text=w["tokens"] if col == 1 else None, rangemode="tozero", row=1, col=col)
        fig.update_yaxes(title_text=w["speed"] if col == 1 else None, rangemode="tozero", ticksuffix="×", row=2, col=col)
    return layout(fig, 520, font_size, margin=dict(l=10, r=10, t=60, b=10))


def shape_table(result: ShapeResult) -> pd.DataFrame:
    """One row per preset and size: both shapes side by side (None where not measurable)."""
    rows = []
    for preset in result.config.presets:
        for n in result.config.sizes:
            chain, tree = result.point(preset, n, "chain"), result.point(preset, n, "tree")
            row = {"prompt": preset_title(preset), "n": n}
            for name, p in (("chain", chain), ("tree", tree)):
                row[f"{name}: tokens / call"] = p.tokens_per_call if p else None
                row[f"{name}: speed-up"] = p.speedup if p else None
            row["tree: nodes / pass"] = tree.nodes_per_pass if tree else None
            same = [p.identical for p in (chain, tree) if p is not None and p.identical is not None]
            row["same tokens as the target"] = ("✓" if all(same) else "✗") if same else "–"
            rows.append(row)
    speeds = {f"{name}: {what}": 2 for name in ("chain", "tree") for what in ("tokens / call", "speed-up")}
    return pd.DataFrame(rows).round({**speeds, "tree: nodes / pass": 1})  # no raw 10.6667 in a cell


def _best(result: ShapeResult, preset: str, shape: str) -> tuple[int, float] | None:
    scored = [(n, p.speedup) for n in result.config.sizes
              if (p := result.point(preset, n, shape)) is not None and p.speedup is not None]
    return max(scored, key=lambda t: t[1]) if scored else None


def verdict(result: ShapeResult, level: str) -> str:
    """What was measured, one line per preset, computed from the runs (Markdown; no model text)."""
    lines = []
    for preset in result.config.presets:
        wins, compared = result.tree_wins(preset)
        title = preset_title(preset)
        if level == "d1":
            lines.append(f"- **{title}:** the tree brought more words per turn at {wins} of {compared} sizes.")
            continue
        best = {shape: _best(result, preset, shape) for shape in SHAPES}
        fastest = "; ".join(f"{shape} {b[1]:.2f}× (n = {b[0]})" for shape, b in best.items() if b is not None)
        lines.append(f"- **{title}:** the tree got more tokens per target call than the chain at {wins} of "
                     f"{compared} sizes; fastest {fastest}.")
    return "\n".join(lines)
