"""The look every figure shares: colour-blind-safe colours, one plotly layout, and token labels for axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from specviz.viz.strip import token_label

# Okabe–Ito colours (colour-blind safe); every series also differs by pattern or marker symbol
P_COLOUR, Q_COLOUR, RES_COLOUR = "#0072B2", "#56B4E9", "#E69F00"
ACC_COLOUR, SPEED_COLOUR, PLAIN_COLOUR = "#009E73", "#0072B2", "#999999"


def chart_label(text: str) -> str:
    """A token as a chart tick: spaces shown as ␣, then escaped (plotly reads a few HTML tags)."""
    return token_label(text.replace(" ", "␣"))


def layout(fig: go.Figure, height: int, font_size: int, legend_below: bool = False, **kw: Any) -> go.Figure:
    """The shared look: white template, tight margins, a horizontal legend above (or below) the plot.

    Keyword arguments go to `update_layout` and win over the defaults (a figure may want its own margin).
    """
    legend = dict(orientation="h", yanchor="top", y=-0.18, x=0) if legend_below else \
        dict(orientation="h", yanchor="bottom", y=1.02, x=0)
    settings: dict[str, Any] = dict(template="plotly_white", height=height, margin=dict(l=10, r=10, t=40, b=10),
                                    font=dict(size=font_size), legend=legend)
    settings.update(kw)
    fig.update_layout(**settings)
    return fig


def wrap_tick(label: str, width: int = 12, seps: str = " ·") -> str:
    """A long tick label broken into lines of about `width` characters at spaces or ·, so none is cut off."""
    lines, line = [], ""
    for ch in label:
        line += ch
        if ch in seps and len(line) >= width:
            lines.append(line.rstrip())
            line = ""
    if line:
        lines.append(line)
    return "<br>".join(lines)


def span(lo: float, hi: float, digits: int, unit: str = "") -> str:
    """A measured range at the level's rounding ("1.4 to 1.5", "1.39× to 1.41×"); one figure when both round alike."""
    a, b = f"{lo:.{digits}f}{unit}", f"{hi:.{digits}f}{unit}"
    return a if a == b else f"{a} to {b}"


def repeat_whiskers(items: Sequence[Any], colour: str, width: int) -> dict | None:
    """Plotly error bars from each item's speed-up to the lowest and highest of its repeats (`speedup`,
    `speedup_low`, `speedup_high`, `repeats`: a lab's bar or point); None where nothing was repeated."""
    def repeated(i: Any) -> bool:
        return i.repeats > 1 and i.speedup is not None and i.speedup_low is not None and i.speedup_high is not None

    if not any(repeated(i) for i in items):
        return None
    up = [max(0.0, i.speedup_high - i.speedup) if repeated(i) else 0.0 for i in items]
    down = [max(0.0, i.speedup - i.speedup_low) if repeated(i) else 0.0 for i in items]
    return dict(type="data", symmetric=False, array=up, arrayminus=down, color=colour, thickness=1.5, width=width)


def repeat_range(item: Any) -> str | None:
    """A table cell: the lowest to the highest speed-up of an item's repeats ("1.10× to 1.31×")."""
    if item.speedup_low is None or item.speedup_high is None:
        return None
    return span(item.speedup_low, item.speedup_high, 2, "×")
