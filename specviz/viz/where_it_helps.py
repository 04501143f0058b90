"""The "Where it helps" bars (speed-up and acceptance per workload, coloured by group) and its table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.labs import ranking
from specviz.viz.style import PLAIN_COLOUR, repeat_range, repeat_whiskers, span, wrap_tick
from specviz.labs.where_it_helps import WorkloadResults, WorkloadRow
from specviz.viz.strip import esc

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler

# Okabe–Ito: bluish green for predictable text, reddish purple (and a hatch) for creative text
GROUP_STYLE: dict[str, tuple[str, str]] = {"predictable": ("#009E73", ""), "creative": ("#CC79A7", "/")}
OTHER_STYLE = ("#999999", ".")

WORDS: dict[str, dict[str, str]] = {
    "d1": {"speed": "how much sooner (× faster)", "acc": "guesses kept (%)", "x": "kind of writing",
           "none": "1 = no gain", "predictable": "easy to guess", "creative": "hard to guess",
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
    """Two panels, one above the other (a phone has no room for them side by side): speed-up per workload with
    the 1× line, and acceptance per workload. Long workload names break into lines so none is cut off."""
    w = WORDS.get(level, WORDS["d2"])
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.2, subplot_titles=(w["t_speed"], w["t_acc"]))
    titles = [wrap_tick(esc(r.title)) for r in rows]
    for group in dict.fromkeys(r.group for r in rows):
        colour, pattern = GROUP_STYLE.get(group, OTHER_STYLE)
        mine = [r for r in rows if r.group == group]
        name = w.get(group, group)
        for panel, field, fmt, scale in ((1, "speedup", ".2f", 1.0), (2, "acceptance", ".0f", 100.0)):
            ys = [None if getattr(r, field) is None else getattr(r, field) * scale for r in mine]
            suffix = "×" if panel == 1 else " %"
            fig.add_bar(x=[wrap_tick(esc(r.title)) for r in mine], y=ys, name=name, legendgroup=group,
                        showlegend=panel == 1, marker=dict(color=colour, pattern_shape=pattern),
                        error_y=repeat_whiskers(mine, PLAIN_COLOUR, 6) if panel == 1 else None,
                        text=[("–" if y is None else f"{y:{fmt}}{suffix}") for y in ys], textposition="outside",
                        hovertemplate=f"%{{x}}: %{{y:{fmt}}}{suffix}<extra>{name}</extra>", row=panel, col=1)
    fig.update_annotations(font_size=font_size)  # the subplot titles
    # the 1× line is explained in the axis title: a label on the line itself sat on the first bar
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dash", width=1.5), row=1, col=1)
    top = max([1.3] + [r.speedup for r in rows if r.speedup is not None])
    fig.update_yaxes(title_text=f"{w['speed']} · dashed {w['none']}", range=[0, top * 1.2], ticksuffix="×", row=1, col=1)
    fig.update_yaxes(title_text=w["acc"], range=[0, 115], ticksuffix=" %", row=2, col=1)
    for panel in (1, 2):
        fig.update_xaxes(title_text=w["x"], categoryorder="array", categoryarray=titles, tickangle=0, row=panel, col=1)
    fig.update_layout(template="plotly_white", height=640, font=dict(size=font_size), barmode="relative",
                      margin=dict(l=10, r=10, t=60, b=10), uniformtext_minsize=max(font_size - 3, 8),
                      legend=dict(orientation="h", yanchor="bottom", y=1.06, x=0))
    return fig


def headline(res: WorkloadResults, level: str = "d2") -> str:
    """The page's headline from what was measured: the workload that gained most, or "about the same" when others
    are within the run's timing noise of it, and whether the predictable group beat the creative one beyond that
    noise (said plainly either way: never a winner the bars beside it do not show)."""
    lead, m = res.leaders(), res.margin
    if not lead:
        return ""
    best, d1 = lead[0], level == "d1"
    if len(lead) == 1:
        rest = sorted((r for r in res.rows if r.speedup is not None and r is not best), key=lambda r: -r.speedup)
        if d1:
            nxt = f"; next came {rest[0].title.lower()}, {rest[0].speedup:.1f} times" if rest else ""
            top = f"The helper helped most with **{best.title.lower()}** ({best.speedup:.1f} times as fast{nxt})."
        else:
            nxt = f", next {rest[0].title} at {rest[0].speedup:.2f}×" if rest else ""
            top = (f"Measured on this pair: **{best.title}** gained most ({best.speedup:.2f}×{nxt}: a lead "
                   f"beyond this run's {m:.0%} noise).")
    else:
        names = _join([r.title.lower() if d1 else r.title for r in lead])
        lo, hi = min(r.speedup for r in lead), max(r.speedup for r in lead)
        top = (f"The helper helped about the same with **{names}** ({span(lo, hi, 1)} times as fast): too close "
               "to name a winner." if d1 else
               f"**{names}** gained about the same ({span(lo, hi, 2, '×')}): closer than this run's {m:.0%} noise, "
               "so no single winner.")
    pred, crea = res.group_mean("predictable", "speedup"), res.group_mean("creative", "speedup")
    if pred is None or crea is None:
        return top
    if ranking.beats(pred, crea, m):
        tail = ("On average, easy-to-guess writing gained more, as expected." if d1 else
                f"On average predictable workloads beat creative ones ({pred:.2f}× against {crea:.2f}×), the usual "
                "pattern.")
    elif ranking.beats(crea, pred, m):
        tail = ("This time the hard-to-guess writing gained more on average: this helper guessed even the stories "
                "well." if d1 else
                f"Here creative workloads beat predictable ones on average ({crea:.2f}× against {pred:.2f}×), the "
                "opposite of the usual pattern: look at the acceptance bars — when the draft agrees with the target "
                "about as often on stories as on code, the text type stops deciding the gain.")
    else:
        tail = ("On average, easy and hard writing came out about the same this time." if d1 else
                f"On average predictable and creative workloads came out about even ({pred:.2f}× against "
                f"{crea:.2f}×, within the noise).")
    return f"{top} {tail}"


def noise_sentence(res: WorkloadResults, level: str) -> str:
    """How steady this measurement's clock was (D2/D5; "" when unknown): repeated, the spread of each workload's own
    runs (the whiskers); a recording, its target-alone runs across the workloads."""
    spread = res.timing_spread
    if level == "d1" or spread is None:
        return ""
    if res.repeated:
        runs = max(r.repeats for r in res.rows)
        return (f"Noise: each workload ran {runs} times, taking turns with the others; one workload's speed-ups "
                f"differed by up to {spread:.0%} between its own runs (the whiskers), so speed-ups closer than "
                f"{res.margin:.0%} are called about the same.")
    times = [r.baseline_ms_per_token for r in res.rows if r.baseline_ms_per_token]
    if not times:
        return ""
    return (f"Noise: the target alone, the same model each time, ran at {min(times):.0f} to {max(times):.0f} ms per "
            f"token across the workloads (a {spread:.0%} spread), so speed-ups closer than {res.margin:.0%} are "
            "called about the same.")


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def workload_table(res: WorkloadResults, level: str) -> Styler:
    """One row per workload: speed-up, acceptance, tokens per round and both speeds (identity too at D5)."""
    rows = []
    for r in res.rows:
        row = {"workload": r.title, "group": r.group, "speed-up": r.speedup}
        if res.repeated:
            row["runs' speed-ups"] = repeat_range(r)
        row |= {"acceptance": r.acceptance, "tokens / round": r.tokens_per_round, "ms / token": r.ms_per_token,
                "target alone ms / token": r.baseline_ms_per_token}
        if level == "d5":
            row["same text as target alone"] = r.identical
        rows.append(row)
    fmt = {"speed-up": "{:.2f}×", "acceptance": "{:.0%}", "tokens / round": "{:.2f}", "ms / token": "{:.0f}",
           "target alone ms / token": "{:.0f}"}
    return pd.DataFrame(rows).style.format(fmt, na_rep="–")
