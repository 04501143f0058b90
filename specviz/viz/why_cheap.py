"""Figures and tables of the "Why checking is cheap" lab: pass time against new tokens, measured speed-up against batch size."""

from __future__ import annotations

import statistics

import pandas as pd
import plotly.graph_objects as go

from specviz.labs.how_far import best_case_speedup
from specviz.core.profile import RoundProfile
from specviz.labs.why_cheap import KernelCost, PassCost, Reference, StepCost
from specviz.bench.batch import BatchReport
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


def gpu_sentence(reference: Reference, gamma: int) -> str:
    """What the second machine's valid figures say: the cost of a 16-token pass, the draft's c, and what follows."""
    pc, sc = reference.pass_cost, reference.step_cost
    if pc is None:
        return ""
    top = pc.ks[-1]
    said = f"On {pc.machine.name} a pass over {top} new tokens cost **{pc.ratios[-1]:.2f}** one-token steps."
    if sc is None or 1 not in sc.batches:
        return said
    c = sc.c_at(1)
    cs = [sc.c_at(b) for b in sc.batches if b <= 8]
    bound = best_case_speedup(gamma, c, 1.0)
    return (f"{said} But the 0.5B draft's step cost **{c:.0%}** of a target step there (c = {min(cs):.2f}–{max(cs):.2f} "
            f"at batch 1–8): both models are held up by launching kernels layer by layer, not by reading weights. "
            f"So even if every guess were accepted, γ = {gamma} could give at most (γ + 1) / (γc + 1) = "
            f"**{bound:.2f}×**, and real acceptance gives less: the model drafter cannot pay on that GPU. "
            "Prompt lookup (c ≈ 0) can, and so could a much cheaper draft.")


def cost_words(steps: float) -> str:
    """A pass's cost in one-token steps, in words that agree with the number beside them."""
    if steps <= 1.15:
        return f"about one step ({steps:.2f})"
    if steps <= 1.6:
        return f"a bit more than one step ({steps:.2f}), far less than one step per token"
    return f"{steps:.2f} steps: well over one, though less than one step per token"


KERNEL_COLOURS = (SPEED_COLOUR, PLAIN_COLOUR, GPU_COLOUR)


def kernel_figure(kc: KernelCost, font_size: int = 14) -> go.Figure:
    """One decoder layer's linears through each kernel: ms against the rows they score (a whole pass runs
    `kc.layers` such layers)."""
    fig = go.Figure()
    for i, name in enumerate(kc.kernels):
        fig.add_scatter(x=list(kc.ks), y=list(kc.median_ms(i)), mode="lines+markers", name=name,
                        line=dict(color=KERNEL_COLOURS[i % len(KERNEL_COLOURS)], width=3),
                        customdata=[[r] for r in kc.ratios(i)],
                        hovertemplate=f"{name}<br>%{{x}} rows: %{{y:.2f}} ms (%{{customdata[0]:.2f}} one-row steps)<extra></extra>")
    return layout(fig, 340, font_size, xaxis=_log2_axis(kc.ks, "rows scored at once"),
                  yaxis=dict(title=f"one layer's linears ({kc.layer_mb:.0f} MB), ms", rangemode="tozero"))


def kernel_table(kc: KernelCost) -> pd.DataFrame:
    """Per row count: each kernel's median ms for one layer's linears and its cost in one-row steps."""
    cols: dict[str, list] = {"rows": list(kc.ks)}
    for i, name in enumerate(kc.kernels):
        cols[f"{name} ms"] = [round(m, 2) for m in kc.median_ms(i)]
        cols[f"{name} × one row"] = [round(r, 2) for r in kc.ratios(i)]
    return pd.DataFrame(cols)


ROLE_NAMES = {"draft": "draft", "verify": "target's check", "round": "between passes"}


def profile_figure(p: RoundProfile, font_size: int = 14, per_role: int = 5) -> go.Figure:
    """One horizontal bar per part of a round (draft, the target's check, between passes), split into its largest
    items: where each ms of an average round went."""
    fig = go.Figure()
    roles = [r for r in ("draft", "verify", "round") if any(x.role == r for x in p.parts)]
    labels = [ROLE_NAMES[r] for r in roles]
    for role in roles:
        parts = sorted((x for x in p.parts if x.role == role), key=lambda x: -x.ms)
        shown, rest = parts[:per_role], sum(x.ms for x in parts[per_role:])
        for x in shown + ([] if rest <= 0 else [type(parts[0])(role, "the rest", rest, 0)]):
            fig.add_bar(y=[ROLE_NAMES[role]], x=[x.ms], orientation="h", name=x.what, showlegend=False,
                        text=[x.what if x.ms >= 0.08 * p.round_ms else ""], textposition="inside",
                        hovertemplate=f"{ROLE_NAMES[role]}: {x.what}<br>%{{x:.1f}} ms per round<extra></extra>")
    return layout(fig, 120 + 60 * len(roles), font_size, barmode="stack",
                  xaxis=dict(title="ms per round (average over the run's rounds)", rangemode="tozero"),
                  yaxis=dict(title="part of the round", categoryorder="array", categoryarray=labels[::-1]))


def profile_table(p: RoundProfile) -> pd.DataFrame:
    """Every lapped part: where, what, ms per round and calls per round, largest first within each part."""
    return pd.DataFrame({
        "where": [ROLE_NAMES[x.role] for x in p.parts], "what": [x.what for x in p.parts],
        "ms per round": [round(x.ms, 2) for x in p.parts], "calls per round": [round(x.calls, 1) for x in p.parts],
    })


def step_cost_table(sc: StepCost) -> pd.DataFrame:
    """Target and draft step times per batch size on the second machine, and their ratio c."""
    return pd.DataFrame({
        "batch": list(sc.batches),
        "target step ms": [round(statistics.median(t), 1) for t in sc.target_step_ms],
        "draft step ms": [round(statistics.median(t), 1) for t in sc.draft_step_ms],
        "c = draft ÷ target": [round(sc.c_at(b), 2) for b in sc.batches],
    })


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


LONG_COLOUR = "#CC79A7"  # Okabe–Ito reddish purple: the long-context recording


def busy_figure(report: BatchReport, long: BatchReport | None = None, font_size: int = 14,
                x_title: str = "runs sharing the big model (batch size)",
                y_title: str = "speed-up over plain decoding (×)", name: str | None = None) -> go.Figure:
    """Measured speed-up against batch size: the median with the repeats' range as whiskers, the 1.0 line, and the
    long-context recording beside it when given."""
    fig = go.Figure()
    batches = sorted({s.batch for s in report.sizes} | ({s.batch for s in long.sizes} if long else set()))
    fig.add_scatter(x=batches, y=[1.0] * len(batches), mode="lines", name="1.0 = no gain",
                    line=dict(color=PLAIN_COLOUR, dash="dash"))
    for rep, colour, label, symbol in ((report, SPEED_COLOUR, name or f"short prompts, γ = {report.gamma}", "diamond"),
                                       (long, LONG_COLOUR, f"prompts of {long.context if long else 0} tokens", "square")):
        if rep is None:
            continue
        mids = [s.speedup for s in rep.sizes]
        fig.add_scatter(x=[s.batch for s in rep.sizes], y=mids, mode="lines+markers",
                        error_y=dict(type="data", symmetric=False, array=[s.speedup_range[1] - s.speedup for s in rep.sizes],
                                     arrayminus=[s.speedup - s.speedup_range[0] for s in rep.sizes], color=colour,
                                     thickness=1.5, width=6),
                        name=f"{label}: median, whiskers = repeats' range", line=dict(color=colour, width=3),
                        marker=dict(symbol=symbol, size=9), hovertemplate="batch %{x}: %{y:.2f}×<extra></extra>")
    top = max([1.2, *[s.speedup_range[1] for s in report.sizes], *([s.speedup_range[1] for s in long.sizes] if long else [])])
    return layout(fig, 380, font_size, xaxis=_log2_axis(tuple(batches), x_title),
                  yaxis=dict(title=y_title, range=[0, top * 1.1]))


def busy_cost_figure(report: BatchReport, font_size: int = 14, x_title: str = "batch size",
                     y_title: str = "verify pass (one-token steps)") -> go.Figure:
    """What a shared verify pass cost at each batch size, in one-token steps of a run alone."""
    fig = go.Figure()
    rows = [s for s in report.sizes if s.verify_steps is not None]
    fig.add_scatter(x=[s.batch for s in rows], y=[s.verify_steps for s in rows], mode="lines+markers",
                    name=f"verify pass of γ + 1 = {report.gamma + 1} tokens per run", line=dict(color=SPEED_COLOUR, width=3),
                    marker=dict(symbol="diamond", size=9), hovertemplate="batch %{x}: %{y:.2f} steps<extra></extra>")
    return layout(fig, 380, font_size, xaxis=_log2_axis(tuple(s.batch for s in rows), x_title),
                  yaxis=dict(title=y_title, rangemode="tozero"))


def pass_words(cost: PassCost, level: str) -> str:
    """The pass measurement in the level's words, every figure from its record (Markdown)."""
    r = dict(zip(cost.ks, cost.ratios))
    top = cost.ks[-1]
    if level == "d1":
        said = f"Checking **{top} words at once** took **{r[top]:.1f} times** as long as writing one word"
        if r[top] <= top / 2:
            return f"{said} — not {top} times. Reading the book is the slow part!"
        return f"{said}. On this computer the extra words were not cheap this time."
    parts = ", ".join(f"{k} tokens ≈ **{r[k]:.2f}**" for k in cost.ks if k > 1)
    said = (f"One plain decoding step (1 new token) took **{cost.step_ms:.0f} ms** here. In one-token steps, a "
            f"single pass over {parts} — if the cost grew with the tokens, {top} tokens would cost {top}.")
    check = max((k for k in cost.ks if k <= 5), default=1)  # a chain of 4 guesses is checked in a pass of 5
    if check > 1:
        said += f" So checking {check} tokens at once cost **{cost_words(r[check])}** here."
    return said


def machine_line(measured: PassCost, level: str) -> str:
    """Where the figures were timed, from the record: the machine, and (D2/D5) the weights and kernel that ran."""
    m = measured.machine
    if level == "d1":
        where = "this computer's processor, no graphics card" if m.device == "cpu" else "this computer's graphics card"
        return f"Timed on {where} ({m.name}), after the big model had read {measured.context_tokens} words of code."
    where = f"this server's CPU ({m.name}; {m.threads} threads), no GPU" if m.device == "cpu" else f"a GPU ({m.name})"
    weights = f", target weights: {measured.weights}" if measured.weights else ""
    return (f"Measured on {where}, pair {measured.pair}{weights}, with {measured.context_tokens} tokens already in "
            "the KV cache.")
