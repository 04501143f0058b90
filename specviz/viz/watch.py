"""The "Watch it work" figures: pure functions of recorded traces (no model, no Streamlit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from specviz.core.trace import RoundTrace, TopDist
from specviz.core.metrics import best_gamma, expected_speedup
from specviz.viz.playback import RaceTimeline, RunningPoint
from specviz.viz.style import (
    ACC_COLOUR, P_COLOUR, PLAIN_COLOUR, Q_COLOUR, RES_COLOUR, SPEED_COLOUR, chart_label, layout,
)

Labels = Mapping[str, str]


def _probs(dist: TopDist | None) -> dict[int, float]:
    return dict(zip(dist.ids, dist.probs)) if dist else {}


def _texts(*dists: TopDist | None) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in dists:
        if d:
            out.update(zip(d.ids, d.texts))
    return out


def rejection_figure(r: RoundTrace, labels: Labels, n_top: int = 10, font_size: int = 14) -> go.Figure | None:
    """At the first rejection: the target's p, the draft's q and the residual over their top tokens.

    The token the correction was drawn from the residual is marked, and so is the rejected guess.
    Returns None when the round had no rejection.
    """
    if r.q_top is None or r.n_accepted >= len(r.draft_ids):
        return None
    p, q, res = _probs(r.p_top), _probs(r.q_top), _probs(r.residual_top)
    texts = _texts(r.p_top, r.q_top, r.residual_top)
    rejected_id = r.draft_ids[r.n_accepted]
    ranked = sorted(texts, key=lambda i: -max(p.get(i, 0.0), q.get(i, 0.0), res.get(i, 0.0)))[:n_top]
    for must in (r.next_id, rejected_id):
        if must in texts and must not in ranked:
            ranked[-1:] = [must]
    xs = list(range(len(ranked)))
    ticks = [chart_label(texts[i]) for i in ranked]
    fig = go.Figure()
    series = (
        (labels.get("chart_p", "target p"), p, P_COLOUR, ""),
        (labels.get("chart_q", "draft q"), q, Q_COLOUR, "/"),
        (labels.get("chart_residual", "residual"), res, RES_COLOUR, "."),
    )
    for name, dist, colour, pattern in series:
        fig.add_bar(
            x=xs, y=[dist.get(i, 0.0) for i in ranked], name=name, marker_color=colour,
            marker_pattern_shape=pattern, hovertemplate="%{y:.3f}<extra>" + name + "</extra>",
        )
    if r.next_id in ranked:
        x = ranked.index(r.next_id)
        fig.add_annotation(x=x, y=max(p.get(r.next_id, 0), res.get(r.next_id, 0)), text="↻ " + labels.get("chart_drawn", "drawn"),
                           showarrow=True, arrowhead=2, ay=-26, font=dict(color="#A65E00"))
    if rejected_id in ranked:
        x = ranked.index(rejected_id)
        fig.add_annotation(x=x, y=q.get(rejected_id, 0), text="✗ " + labels.get("chart_guess", "guess"),
                           showarrow=True, arrowhead=2, ay=-26, font=dict(color="#D55E00"))
    fig.update_xaxes(tickmode="array", tickvals=xs, ticktext=ticks)
    fig.update_yaxes(range=[0, 1.3], tickvals=[0, 0.25, 0.5, 0.75, 1], title=labels.get("chart_prob", "probability"))
    title = labels.get("chart_title", "Round {n}: why the guess was rejected").format(n=r.index + 1)
    fig = layout(fig, 380, font_size, legend_below=True, barmode="group",
                 title=dict(text=title, x=0, font=dict(size=font_size + 2)))
    return fig.update_layout(margin=dict(t=56))


def running_figure(points: Sequence[RunningPoint], labels: Labels, font_size: int = 14) -> go.Figure:
    """Acceptance (left axis) and measured speed-up (right axis) after every round."""
    xs = [pt.round for pt in points]
    fig = go.Figure()
    fig.add_scatter(x=xs, y=[pt.acceptance for pt in points], name=labels.get("acceptance", "acceptance"),
                    mode="lines+markers", line=dict(color=ACC_COLOUR), marker=dict(symbol="circle"),
                    hovertemplate="%{y:.0%}<extra></extra>")
    if any(pt.speedup is not None for pt in points):
        fig.add_scatter(x=xs, y=[pt.speedup for pt in points], name=labels.get("speedup", "speed-up"), yaxis="y2",
                        mode="lines+markers", line=dict(color=SPEED_COLOUR, dash="dash"), marker=dict(symbol="diamond"),
                        hovertemplate="%{y:.2f}×<extra></extra>")
        fig.add_hline(y=1.0, yref="y2", line=dict(color=PLAIN_COLOUR, dash="dot", width=1))
    top = max([pt.speedup or 0 for pt in points] + [2.0])
    return layout(
        fig, 240, font_size,
        xaxis=dict(title=labels.get("round_axis", "round"), nticks=10, rangemode="tozero"),
        yaxis=dict(title=labels.get("acceptance", "acceptance"), range=[0, 1.05], tickformat=".0%"),
        yaxis2=dict(title=labels.get("speedup", "speed-up"), overlaying="y", side="right", range=[0, top * 1.1],
                    ticksuffix="×", tickformat=".1f", showgrid=False),
    )


def race_figure(spec: RaceTimeline, plain: RaceTimeline, labels: Labels, font_size: int = 14) -> go.Figure:
    """Tokens produced against measured time for both runs, as step lines."""
    fig = go.Figure()
    for name, tl, colour, dash in ((labels.get("race_plain", "plain"), plain, PLAIN_COLOUR, "dot"),
                                   (labels.get("race_spec", "speculative"), spec, ACC_COLOUR, "solid")):
        fig.add_scatter(x=[0.0] + [t / 1000 for t in tl.times_ms], y=[0] + list(tl.tokens), name=name,
                        line=dict(color=colour, dash=dash, shape="hv"), mode="lines")
    return layout(fig, 260, font_size, xaxis=dict(title=labels.get("race_time", "seconds (measured)")),
                  yaxis=dict(title=labels.get("tokens", "tokens")))


def tradeoff_figure(alpha: float, c: float, gamma: float, measured: float | None, labels: Labels,
                    font_size: int = 14) -> go.Figure:
    """Leviathan's expected speed-up against γ for the measured α and c, with this run marked."""
    gammas = list(range(1, 17))
    fig = go.Figure()
    fig.add_scatter(x=gammas, y=[expected_speedup(alpha, g, c) for g in gammas], mode="lines+markers",
                    name=labels.get("expected", "expected"), line=dict(color=SPEED_COLOUR))
    fig.add_scatter(x=[gamma], y=[expected_speedup(alpha, gamma, c)], mode="markers", name=f"γ = {gamma:.3g}",
                    marker=dict(size=14, symbol="circle-open", color=SPEED_COLOUR, line=dict(width=3)))
    if measured is not None:
        fig.add_scatter(x=[gamma], y=[measured], mode="markers", name=labels.get("measured", "measured"),
                        marker=dict(size=13, symbol="x", color="#D55E00"))
    best = best_gamma(alpha, c)
    fig.add_vline(x=best, line=dict(color=PLAIN_COLOUR, dash="dot"))
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot", width=1))
    title = f"α = {alpha:.2f}, c = {c:.2f}: best γ ≈ {best}"
    return layout(fig, 260, font_size, title=dict(text=title, x=0, font=dict(size=font_size + 1)),
                  xaxis=dict(title="γ", dtick=1), yaxis=dict(title=labels.get("speedup", "speed-up"), ticksuffix="×"))


def verify_cost_figure(rounds: Sequence[RoundTrace], plain: Sequence[RoundTrace], labels: Labels,
                       font_size: int = 14) -> go.Figure:
    """Measured ms of one target pass against how many tokens it scored (k drafted + 1)."""
    fig = go.Figure()
    if plain:
        fig.add_scatter(x=[1] * len(plain), y=[r.verify_ms for r in plain], mode="markers", name=labels.get("race_plain", "plain"),
                        marker=dict(color=PLAIN_COLOUR, symbol="circle-open"))
    fig.add_scatter(x=[len(r.draft_ids) + 1 for r in rounds], y=[r.verify_ms for r in rounds], mode="markers",
                    name=labels.get("race_spec", "speculative"), marker=dict(color=ACC_COLOUR, symbol="diamond"))
    return layout(fig, 240, font_size, xaxis=dict(title=labels.get("cost_x", "tokens scored in one pass"), dtick=1),
                  yaxis=dict(title="ms", rangemode="tozero"))
