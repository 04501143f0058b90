"""Figures and tables of the "Why checking is cheap" lab: pass time against new tokens, speed-up against batch size."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from specviz.labs.why_cheap import BatchEffect, PassCost
from specviz.viz.style import ACC_COLOUR, PLAIN_COLOUR, SPEED_COLOUR, layout

GPU_COLOUR = "#D55E00"  # Okabe–Ito vermilion: figures measured on a GPU elsewhere


def _log2_axis(values: tuple[int, ...], title: str) -> dict[str, object]:
    """A log-2 axis with a tick at each measured value (1, 2, 4, 8, 16 stay evenly spaced)."""
    return dict(title=title, type="log", tickvals=list(values), ticktext=[str(v) for v in values])


def pass_time_figure(cost: PassCost, font_size: int = 14, x_title: str = "new tokens in one target pass",
                     y_title: str = "time of the pass (ms)", measured_name: str = "measured here (median)",
                     linear_name: str = "if the cost grew with the tokens") -> go.Figure:
    """Time of one target pass against the new tokens it scores, with every repeat and the linear line."""
    fig = go.Figure()
    fig.add_scatter(x=list(cost.ks), y=list(cost.linear_ms), mode="lines", name=linear_name,
                    line=dict(color=PLAIN_COLOUR, dash="dash"))
    xs = [k for k, ts in zip(cost.ks, cost.times_ms) for _ in ts]
    ys = [t for ts in cost.times_ms for t in ts]
    fig.add_scatter(x=xs, y=ys, mode="markers", name="each repeat",
                    marker=dict(color=SPEED_COLOUR, size=5, opacity=0.35),
                    hovertemplate="%{x} tokens: %{y:.0f} ms<extra></extra>")
    fig.add_scatter(x=list(cost.ks), y=list(cost.median_ms), mode="lines+markers", name=measured_name,
                    line=dict(color=SPEED_COLOUR, width=3), marker=dict(symbol="diamond", size=9),
                    hovertemplate="%{x} tokens: %{y:.0f} ms<extra></extra>")
    return layout(fig, 360, font_size, xaxis=_log2_axis(cost.ks, x_title),
                  yaxis=dict(title=y_title, rangemode="tozero"))


def pass_ratio_figure(cost: PassCost, reference: PassCost | None = None, font_size: int = 14,
                      x_title: str = "new tokens in one target pass",
                      y_title: str = "cost of the pass (one-token steps)") -> go.Figure:
    """The pass's cost in one-token steps: 1 would be free, k would be linear; a GPU reference if there is one."""
    fig = go.Figure()
    ks = list(cost.ks)
    fig.add_scatter(x=ks, y=ks, mode="lines", name="linear: k steps", line=dict(color=PLAIN_COLOUR, dash="dash"))
    fig.add_scatter(x=ks, y=[1.0] * len(ks), mode="lines", name="free: one step",
                    line=dict(color=ACC_COLOUR, dash="dot"))
    fig.add_scatter(x=ks, y=list(cost.ratios), mode="lines+markers", name=f"this machine ({cost.machine.device})",
                    line=dict(color=SPEED_COLOUR, width=3), marker=dict(symbol="diamond", size=9),
                    hovertemplate="%{x} tokens: %{y:.2f} steps<extra></extra>")
    if reference is not None:
        fig.add_scatter(x=list(reference.ks), y=list(reference.ratios), mode="lines+markers",
                        name=f"{reference.machine.name} ({reference.pair})", line=dict(color=GPU_COLOUR, width=3),
                        marker=dict(symbol="square", size=8),
                        hovertemplate="%{x} tokens: %{y:.2f} steps<extra></extra>")
    return layout(fig, 360, font_size, xaxis=_log2_axis(cost.ks, x_title),
                  yaxis=dict(title=y_title, type="log", tickvals=[1, 2, 4, 8, 16]))


def batch_speedup_figure(effect: BatchEffect, reference: BatchEffect | None = None, font_size: int = 14,
                         x_title: str = "batch size (sequences per pass)",
                         y_title: str = "expected speed-up (×)") -> go.Figure:
    """Expected speed-up at each batch size from measured pass times, with the 1.0 line and the real batch-1 run."""
    fig = go.Figure()
    batches = [p.batch for p in effect.points]
    if reference is not None:
        batches = sorted(set(batches) | {p.batch for p in reference.points})
    fig.add_scatter(x=batches, y=[1.0] * len(batches), mode="lines", name="1.0 = no gain",
                    line=dict(color=PLAIN_COLOUR, dash="dash"))
    fig.add_scatter(x=[p.batch for p in effect.points], y=list(effect.speedups), mode="lines+markers",
                    name=f"this machine ({effect.machine.device}), from measured passes",
                    line=dict(color=SPEED_COLOUR, width=3), marker=dict(symbol="diamond", size=9),
                    hovertemplate="batch %{x}: %{y:.2f}×<extra></extra>")
    if effect.run_speedup is not None:
        fig.add_scatter(x=[1], y=[effect.run_speedup], mode="markers", name="real speculative run (batch 1)",
                        marker=dict(color=ACC_COLOUR, symbol="star", size=14),
                        hovertemplate="real run: %{y:.2f}×<extra></extra>")
    if reference is not None:
        fig.add_scatter(x=[p.batch for p in reference.points], y=list(reference.speedups), mode="lines+markers",
                        name=f"{reference.machine.name} ({reference.pair})", line=dict(color=GPU_COLOUR, width=3),
                        marker=dict(symbol="square", size=8), hovertemplate="batch %{x}: %{y:.2f}×<extra></extra>")
    return layout(fig, 360, font_size, xaxis=_log2_axis(tuple(batches), x_title),
                  yaxis=dict(title=y_title, rangemode="tozero"))


def batch_cost_figure(effect: BatchEffect, font_size: int = 14, x_title: str = "batch size (sequences per pass)",
                      y_title: str = "time of the pass (ms)") -> go.Figure:
    """Median ms of the one-token step and of the (γ+1)-token verify pass at each batch size."""
    fig = go.Figure()
    batches = [p.batch for p in effect.points]
    fig.add_scatter(x=batches, y=[p.step_median_ms for p in effect.points], mode="lines+markers",
                    name="step: 1 new token per sequence", line=dict(color=PLAIN_COLOUR, width=3),
                    marker=dict(symbol="circle", size=8))
    fig.add_scatter(x=batches, y=[p.verify_median_ms for p in effect.points], mode="lines+markers",
                    name=f"verify: {effect.gamma + 1} new tokens per sequence", line=dict(color=SPEED_COLOUR, width=3),
                    marker=dict(symbol="diamond", size=9))
    return layout(fig, 320, font_size, xaxis=_log2_axis(tuple(batches), x_title),
                  yaxis=dict(title=y_title, rangemode="tozero"))


def pass_table(cost: PassCost) -> pd.DataFrame:
    """One row per pass size: median, fastest and slowest time, cost in one-token steps, time per token."""
    return pd.DataFrame({
        "new tokens": list(cost.ks),
        "median ms": [round(m, 1) for m in cost.median_ms],
        "fastest ms": [round(min(t), 1) for t in cost.times_ms],
        "slowest ms": [round(max(t), 1) for t in cost.times_ms],
        "× one-token step": [round(x, 2) for x in cost.ratios],
        "ms per token": [round(m / k, 1) for m, k in zip(cost.median_ms, cost.ks)],
    })


def batch_table(effect: BatchEffect) -> pd.DataFrame:
    """One row per batch size: median step, verify and draft times, their ratios, and the expected speed-up."""
    ps = effect.points
    return pd.DataFrame({
        "batch": [p.batch for p in ps],
        "step ms": [round(p.step_median_ms, 1) for p in ps],
        f"verify ms (γ+1 = {effect.gamma + 1})": [round(p.verify_median_ms, 1) for p in ps],
        "r = verify ÷ step": [round(p.verify_ratio, 2) for p in ps],
        "draft step ms": [round(p.draft_median_ms, 1) for p in ps],
        "c(b)": [round(c, 3) if (c := effect.c_at(p)) is not None else None for p in ps],
        "expected speed-up": [round(x, 2) if x is not None else None for x in effect.speedups],
    })
