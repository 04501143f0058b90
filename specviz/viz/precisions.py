"""Words, figure and table of "Two precisions, one lesson" (Why checking is cheap): every figure from the run shown."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from specviz.labs.precisions import CROSS, PrecisionCurve, TwoPrecisions
from specviz.viz.style import PLAIN_COLOUR, SPEED_COLOUR, layout

NAMES = {  # (4-bit, 16-bit) in each level's words
    "d1": ("small numbers (4 bits)", "big numbers (16 bits)"),
    "d2": ("the file's own 4-bit blocks", "16-bit weights"),
    "d5": ("gguf (the file's 4-bit blocks)", "fp16w (16-bit weights)"),
}
SAME_SHARE = 0.1  # two costs in steps within a tenth of each other: "about the same"


def names(level: str) -> tuple[str, str]:
    return NAMES.get(level, NAMES["d2"])


def figure(two: TwoPrecisions, level: str, font_size: int = 14) -> go.Figure:
    """Both pass-cost curves in each precision's own steps, the 1.5-step line, and where each crosses it."""
    four, sixteen = names(level)
    fig = go.Figure()
    ks = list(two.four.cost.ks)
    fig.add_scatter(x=ks, y=[CROSS] * len(ks), mode="lines", name=f"{CROSS:g} steps",
                    line=dict(color=PLAIN_COLOUR, dash="dot"))
    for curve, name, colour, symbol in ((two.four, four, SPEED_COLOUR, "diamond"),
                                        (two.sixteen, sixteen, PLAIN_COLOUR, "square")):
        fig.add_scatter(x=ks, y=list(curve.cost.ratios), mode="lines+markers", name=name,
                        line=dict(color=colour, width=3), marker=dict(symbol=symbol, size=9),
                        hovertemplate="%{x} new tokens: %{y:.2f} steps<extra></extra>")
        at = curve.crossing()
        if at is not None:
            fig.add_scatter(x=[at], y=[CROSS], mode="markers", showlegend=False, marker=dict(color=colour, size=14,
                            symbol="circle-open", line=dict(width=3)),
                            hovertemplate=f"{name}: {CROSS:g} steps at about %{{x:.1f}} new tokens<extra></extra>")
    x_title = "words checked at once" if level == "d1" else "new tokens in one pass"
    y_title = "time, in its own one-word times" if level == "d1" else "cost of the pass (its own one-token steps)"
    return layout(fig, 360, font_size, xaxis=dict(title=x_title, type="log", tickvals=ks, ticktext=[str(k) for k in ks]),
                  yaxis=dict(title=y_title, rangemode="tozero"))


def _crossing_words(curve: PrecisionCurve, name: str) -> str:
    at = curve.crossing()
    top = curve.cost.ks[-1]
    if at is None:
        return f"{name} never reached {CROSS:g} steps up to {top} new tokens ({curve.cost.ratios[-1]:.2f} at {top})"
    return f"{name} crossed {CROSS:g} steps at about **{at:.1f} new tokens**"


def _first_up(text: str) -> str:
    return text[:1].upper() + text[1:]


def cheaper_to_check(two: TwoPrecisions, rows: int = 16) -> str | None:
    """"four" or "sixteen": which checked `rows` new tokens for fewer of its own steps; None: within SAME_SHARE."""
    a, b = two.four.steps_at(rows), two.sixteen.steps_at(rows)
    if abs(a - b) <= SAME_SHARE * min(a, b):
        return None
    return "four" if a < b else "sixteen"


def words(two: TwoPrecisions, level: str) -> str:
    """D1: one sentence; D2 and D5: the two curves and their crossings, every figure from the run (Markdown)."""
    four, sixteen = names(level)
    top = two.four.cost.ks[-1]
    s4, s16 = two.four.cost.step_ms, two.sixteen.cost.step_ms
    r4, r16 = two.four.steps_at(top), two.sixteen.steps_at(top)
    if level == "d1":
        said = (f"With {sixteen} one word took **{s16 / 1000:.2f} seconds** and checking {top} words at once took "
                f"{r16:.1f} times that; with {four} one word took only **{s4 / 1000:.2f} seconds**, and checking {top} "
                f"took {r4:.1f} times that")
        who = cheaper_to_check(two, top)
        if who == "sixteen":
            return said + ": small numbers make each word quicker, but checking many words costs more of them."
        if who == "four":
            return said + ": here small numbers were quicker for one word and for checking too."
        return said + ": checking cost about the same share of a word both ways."
    said = (f"One step took **{s4:.0f} ms** with {four} and **{s16:.0f} ms** with {sixteen} on this machine "
            f"({s16 / s4:.1f}× as long). Counted in its own steps, a pass over {top} new tokens cost **{r4:.2f}** with "
            f"{four} and **{r16:.2f}** with {sixteen}. {_first_up(_crossing_words(two.four, four))}; "
            f"{_crossing_words(two.sixteen, sixteen)}.")
    if level == "d5":
        said += (f" The draft's step took {two.four.draft_step_ms:.0f} ms, so c = {two.four.c:.2f} beside the 4-bit "
                 f"target and {two.sixteen.c:.2f} beside the 16-bit one.")
    return said


def table(two: TwoPrecisions, alpha: float) -> pd.DataFrame:
    """D5: each precision's step, passes in steps, crossing, c, best γ and expected speed-up at this α."""
    rows = []
    for curve, name in ((two.four, NAMES["d5"][0]), (two.sixteen, NAMES["d5"][1])):
        at = curve.crossing()
        gamma, speedup = curve.best(alpha)
        rows.append({
            "precision": name, "kernel": curve.weights, "one step (ms)": f"{curve.cost.step_ms:.1f}",
            **{f"{k} tokens (steps)": f"{r:.2f}" for k, r in zip(curve.cost.ks, curve.cost.ratios) if k > 1},
            f"crosses {CROSS:g} steps at": "not within 16" if at is None else f"{at:.1f} tokens",
            "draft's c": f"{curve.c:.2f}", "best γ": str(gamma), "expected speed-up": f"{speedup:.2f}×",
        })
    return pd.DataFrame(rows)


def best_words(two: TwoPrecisions, alpha: float) -> str:
    """D5: the best γ and speed-up of each precision at this α, from the measured curve and c (Markdown)."""
    (g4, x4), (g16, x16) = two.four.best(alpha), two.sixteen.best(alpha)
    return (f"At α = {alpha:.2f}, with this machine's verify cost and c: the 4-bit target's best γ is **{g4}** "
            f"(expected **{x4:.2f}×** its own plain decoding), the 16-bit target's **{g16}** (**{x16:.2f}×**). "
            f"Leviathan's (1 − α^(γ+1)) / ((1 − α)(γc + T(γ+1))), T read off each curve.")
