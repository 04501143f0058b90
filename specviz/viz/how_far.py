"""The "How far to guess" chart (Leviathan's curves against γ, the measured points, the best γ) and its table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.labs.how_far import Curves, GammaPoint, Sweep, expected_at
from specviz.viz import strip
from specviz.viz.style import ACC_COLOUR, PLAIN_COLOUR, SPEED_COLOUR, layout, repeat_range, repeat_whiskers, span

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler

MEASURED_COLOUR = "#D55E00"  # Okabe–Ito vermillion: the measured points
CUSTOM_COLOUR = "#CC79A7"  # reddish purple: the sliders' curves
VERIFY_COLOUR = "#E69F00"  # orange: the curve with the measured verify cost

# axis and legend words per level (D1 avoids every symbol)
WORDS: dict[str, dict[str, str]] = {
    "d1": {
        "x": "how many words the helper guesses each turn", "tokens": "words per big-model turn",
        "speed": "how much sooner (× faster)", "curve": "what the maths predicts", "points": "what we measured",
        "custom": "your helper", "best": "best", "verify": "what the maths predicts for this computer",
        "textbook": "", "none": "no gain",
    },
    "d2": {
        "x": "γ — tokens guessed per round", "tokens": "tokens per round", "speed": "speed-up (×)",
        "curve": "expected (measured α, c)", "points": "measured here", "custom": "expected (your α, c)",
        "best": "best γ", "verify": "expected, with the measured cost of a check",
        "textbook": "textbook (a check costs 1 step)", "none": "no gain",
    },
    "d5": {
        "x": "γ (draft length, tokens)", "tokens": "E[tokens per round]", "speed": "speed-up (× wall time)",
        "curve": "Leviathan (measured α, c)", "points": "measured", "custom": "Leviathan (slider α, c)",
        "best": "best γ", "verify": "Leviathan with measured verify cost",
        "textbook": "Leviathan, verify = 1 step", "none": "1× = no gain",
    },
}


def _best_marker(fig: go.Figure, curves: Curves, colour: str, name: str, row: int, d1: bool = False) -> None:
    """A star on the curve at its best γ (at D1 "4 guesses": no symbol), and a dotted line down to the axis."""
    i = curves.gammas.index(curves.best)
    label = f"{curves.best} {'guess' if curves.best == 1 else 'guesses'}" if d1 else f"γ = {curves.best}"
    fig.add_scatter(x=[curves.best], y=[curves.speedup[i]], mode="markers+text", name=name,
                    marker=dict(symbol="star", size=17, color=colour, line=dict(width=1, color="white")),
                    text=[label], textposition="top center", textfont=dict(color=colour),
                    hovertemplate=f"{name}: γ = %{{x}}, %{{y:.2f}}×<extra></extra>", row=row, col=1)
    fig.add_vline(x=curves.best, line=dict(color=colour, dash="dot", width=1), row=row, col=1)


def _curve(fig: go.Figure, xs: Sequence[int], ys: Sequence[float], name: str, colour: str, dash: str, row: int,
           legend: bool, fmt: str) -> None:
    fig.add_scatter(x=list(xs), y=list(ys), mode="lines", name=name, line=dict(color=colour, dash=dash, width=2.5),
                    showlegend=legend, legendgroup=name, row=row, col=1,
                    hovertemplate=f"γ = %{{x}}: %{{y:{fmt}}}<extra>{name}</extra>")


def _points(fig: go.Figure, points: Sequence[GammaPoint], field: str, name: str, row: int, legend: bool,
            best_gamma: int | None, fmt: str) -> None:
    pts = [p for p in points if getattr(p, field) is not None]
    if not pts:
        return
    sizes = [17 if p.gamma == best_gamma else 12 for p in pts]
    fig.add_scatter(x=[p.gamma for p in pts], y=[getattr(p, field) for p in pts], mode="markers", name=name,
                    marker=dict(symbol="x", size=sizes, color=MEASURED_COLOUR, line=dict(width=1)),
                    error_y=repeat_whiskers(pts, MEASURED_COLOUR, 5) if field == "speedup" else None,
                    showlegend=legend, legendgroup=name, row=row, col=1,
                    hovertemplate=f"γ = %{{x}}: %{{y:{fmt}}}<extra>{name}</extra>")


def noise_words(sweep: Sweep, level: str) -> str:
    """How steady this sweep's clock was, from its own repeats (D2/D5; "" at D1 or with one run each)."""
    spread = sweep.timing_spread
    if level == "d1" or spread is None:
        return ""
    runs = max(p.repeats for p in sweep.points)
    return (f"Noise: every γ ran {runs} times, taking turns with the others and the target alone; one γ's speed-ups "
            f"differed by up to {spread:.0%} between its own runs (the whiskers), so γ closer than {sweep.margin:.0%} "
            "to the fastest are called about the same.")


def how_far_figure(measured: Curves | None, points: Sequence[GammaPoint], custom: Curves | None = None,
                   verify: Curves | None = None, level: str = "d2", font_size: int = 13) -> go.Figure:
    """Expected tokens per round (top) and expected speed-up (bottom) against γ = 1..16.

    `measured`: the textbook curves for the measured α and c (a verify pass costs one step); `verify`:
    the same with the measured verify cost, which then is the main curve with the star while the
    textbook one is dashed; `points`: the measured runs; `custom`: the sliders' curves (None when the
    sliders sit on the measurement). D1 shows the speed-up panel only.
    """
    w = WORDS.get(level, WORDS["d2"])
    both = level != "d1"
    fig = make_subplots(rows=2 if both else 1, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    speed_row = 2 if both else 1
    best_point = max((p for p in points if p.speedup is not None), key=lambda p: p.speedup, default=None)
    main = (verify, w["verify"]) if verify is not None else (measured, w["curve"])
    textbook = measured if verify is not None and w["textbook"] else None
    for curves, name, colour, dash, star in ((main[0], main[1], SPEED_COLOUR, "solid", True),
                                             (textbook, w["textbook"], PLAIN_COLOUR, "dash", False),
                                             (custom, w["custom"], CUSTOM_COLOUR, "dash", True)):
        if curves is None:
            continue
        if both:
            _curve(fig, curves.gammas, curves.tokens, name, colour, dash, 1, False, ".2f")
        _curve(fig, curves.gammas, curves.speedup, name, colour, dash, speed_row, True, ".2f")
        if star:
            _best_marker(fig, curves, colour, f"{w['best']} ({name})", speed_row, level == "d1")
    if both:
        _points(fig, points, "tokens_per_round", w["points"], 1, False, None, ".2f")
    _points(fig, points, "speedup", w["points"], speed_row, True, best_point.gamma if best_point else None, ".2f")
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot", width=1), row=speed_row, col=1,
                  annotation_text=w["none"], annotation_position="bottom right",
                  annotation_font=dict(color=PLAIN_COLOUR, size=max(font_size - 2, 9)))
    top = max([1.5] + [y for c in (measured, custom, verify) if c for y in c.speedup]
              + [p.speedup for p in points if p.speedup is not None])
    fig.update_yaxes(title_text=w["speed"], ticksuffix="×", range=[0, top * 1.15], row=speed_row, col=1)
    if both:
        fig.update_yaxes(title_text=w["tokens"], rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text=w["x"], dtick=1, range=[0.5, 16.5], row=speed_row, col=1)
    fig.update_xaxes(dtick=1, range=[0.5, 16.5], row=1, col=1)
    return layout(fig, 560 if both else 340, font_size, margin=dict(l=10, r=10, t=30, b=10))


def verify_cost_bars(points: Sequence[GammaPoint], font_size: int = 13) -> go.Figure:
    """Measured cost of one verify pass (γ + 1 tokens scored) in one-token target steps, against γ."""
    pts = [p for p in points if p.verify_steps is not None]
    fig = go.Figure()
    fig.add_bar(x=[p.gamma for p in pts], y=[p.verify_steps for p in pts], marker_color=ACC_COLOUR,
                name="measured", hovertemplate="γ = %{x}: %{y:.2f} target steps<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot"), annotation_text="Leviathan's assumption: 1 step",
                  annotation_position="top left")
    fig.update_layout(template="plotly_white", height=260, font=dict(size=font_size), margin=dict(l=10, r=10, t=30, b=10),
                      xaxis=dict(title="γ (the pass scores γ + 1 tokens)", dtick=1),
                      yaxis=dict(title="verify pass (× one target step)", rangemode="tozero"), showlegend=False)
    return fig


def _gammas(points: Sequence[GammaPoint]) -> str:
    names = [str(p.gamma) for p in points]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _sides(points: Sequence[GammaPoint], curves: Curves, margin: float) -> tuple[list[GammaPoint], list[GammaPoint]]:
    """The measured points below and above a curve (by more than `margin`×; those on it are in neither)."""
    at = dict(zip(curves.gammas, curves.speedup))
    scored = [p for p in points if p.speedup is not None and p.gamma in at]
    return ([p for p in scored if p.speedup < at[p.gamma] - margin],
            [p for p in scored if p.speedup > at[p.gamma] + margin])


def curve_position_sentence(points: Sequence[GammaPoint], textbook: Curves, verify: Curves | None,
                            margin: float = 0.05) -> str:
    """Where the measured points sit against the textbook curve (and the measured-cost one), said from the data."""
    below, above = _sides(points, textbook, margin)
    parts = []
    if below:
        parts.append(f"below the textbook curve at γ = {_gammas(below)}")
    if above:
        parts.append(f"above it at γ = {_gammas(above)}")
    said = "The measured points sit " + " and ".join(parts) if parts else \
        "The measured points sit on the textbook curve (within ±0.05×)"
    if verify is None:
        return said + "."
    v_below, v_above = _sides(points, verify, margin)
    near = len([p for p in points if p.speedup is not None]) - len(v_below) - len(v_above)
    return (f"{said}; the curve with the measured verify cost passes within ±{margin:.2f}× of {near} of them. "
            f"Its best γ is {verify.best}, the textbook's {textbook.best}.")


def sweep_table(sweep: Sweep, level: str) -> Styler:
    """One row per γ: measured and expected speed-up, tokens per round, both acceptances (and c, cost at D5)."""
    rows = []
    for p in sweep.points:
        row = {
            "γ": p.gamma, "speed-up (measured)": p.speedup,
            **({"runs' speed-ups": repeat_range(p)} if p.repeats > 1 else {}),
            "expected (Leviathan)": expected_at(sweep, p.gamma),
            "tokens / round": p.tokens_per_round, "acceptance (accepted ÷ drafted)": p.acceptance,
            "α (accepted ÷ checked)": p.alpha, "ms / token": p.ms_per_token,
        }
        if level == "d5":
            row.update({"c": p.c, "verify pass (target steps)": p.verify_steps, "same text as target alone": p.identical})
        rows.append(row)
    frame = pd.DataFrame(rows)
    fmt = {k: "{:.2f}" for k in frame.columns if k not in ("γ", "same text as target alone", "runs' speed-ups")}
    fmt["ms / token"] = "{:.0f}"
    return frame.style.format(fmt, na_rep="–")


def position_figure(series: Sequence[tuple[str, Sequence[float]]], font_size: int = 13) -> go.Figure:
    """Per drafted position k, the share of rounds that accepted their k-th guess: one line per run."""
    fig = go.Figure()
    palette = (ACC_COLOUR, MEASURED_COLOUR, VERIFY_COLOUR, CUSTOM_COLOUR, SPEED_COLOUR, PLAIN_COLOUR)
    for i, (name, shares) in enumerate(series):
        fig.add_scatter(x=list(range(1, len(shares) + 1)), y=list(shares), mode="lines+markers", name=name,
                        line=dict(color=palette[i % len(palette)]),
                        hovertemplate="guess %{x}: accepted in %{y:.0%} of rounds<extra>" + name + "</extra>")
    return layout(fig, 260, font_size, xaxis=dict(title="position of the guess in its round (k)", dtick=1),
                  yaxis=dict(title="rounds that accepted it", tickformat=".0%", range=[0, 1.05]))


def position_sentence(shares: Sequence[float], gamma: float | None = None) -> str | None:
    """The first and last position's acceptance in words, and why a longer draft pays less (None: too short)."""
    if len(shares) < 2:
        return None
    first, last, k = shares[0], shares[-1], len(shares)
    where = f"γ = {gamma:g}: " if gamma is not None else ""
    return (f"{where}the 1st guess was accepted in {first:.0%} of rounds, guess {k} in {last:.0%}. A guess counts "
            "only when every guess before it in the round was accepted, so each further position is accepted at "
            "most as often as the one before: the last guesses of a long draft are the ones that rarely pay for "
            "their drafting.")


def fastest_words(lead: Sequence[GammaPoint]) -> str:
    """D1: the fastest number of guesses, or the few that came out about the same, with the story's words."""
    def guesses(g: int) -> str:
        return f"{g} {'guess' if g == 1 else 'guesses'}"

    best = lead[0]
    if len(lead) == 1:
        return (f"The fastest was **{guesses(best.gamma)} per turn**: with it the answer came "
                f"**{strip.speed_words(best.speedup)}** ({best.speedup:.1f} times as fast as the big model alone).")
    names = " and ".join(guesses(p.gamma) for p in sorted(lead, key=lambda p: p.gamma))
    lo, hi = min(p.speedup for p in lead), max(p.speedup for p in lead)  # type: ignore[type-var]
    return (f"**{names} per turn** came out about the same ({span(lo, hi, 1)} times as fast as the big model "
            "alone): too close to name one winner.")
