"""The look every figure shares: colour-blind-safe colours, one plotly layout, and token labels for axes."""

from __future__ import annotations

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
