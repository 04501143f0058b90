"""The "Watch it work" figures: pure functions of recorded traces (no model, no Streamlit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from specviz.core import drafters
from specviz.core.trace import RoundTrace, TopDist
from specviz.bench.gpu import GpuCosts
from specviz.labs.how_far import Curves, RunTradeoff, best_case_speedup
from specviz.train.data import RecordConfig
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
        fig, max(240, 19 * font_size), font_size,  # presenter type (19 px) needs a taller plot: 361 px
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


def _curve_at(curves: Curves, gamma: float) -> float:
    """A curve's value at a (possibly fractional, mean) γ, by linear interpolation between its integer points."""
    g = min(max(gamma, curves.gammas[0]), curves.gammas[-1])
    lo = max(i for i, x in enumerate(curves.gammas) if x <= g)
    hi = min(lo + 1, len(curves.gammas) - 1)
    span = curves.gammas[hi] - curves.gammas[lo]
    t = (g - curves.gammas[lo]) / span if span else 0.0
    return curves.speedup[lo] + t * (curves.speedup[hi] - curves.speedup[lo])


def tradeoff_figure(textbook: Curves, with_cost: Curves | None, gamma: float, measured: float | None, labels: Labels,
                    font_size: int = 14) -> go.Figure:
    """Expected speed-up against γ: the curve with the measured verify cost (solid, its best γ starred) and the
    textbook curve, where a verify pass costs one step (dashed); this run's γ and measured speed-up marked."""
    main = with_cost or textbook
    fig = go.Figure()
    if with_cost is not None:
        fig.add_scatter(x=list(with_cost.gammas), y=list(with_cost.speedup), mode="lines+markers",
                        name=labels.get("expected_cost", "expected, measured verify cost"), line=dict(color=SPEED_COLOUR))
    fig.add_scatter(x=list(textbook.gammas), y=list(textbook.speedup), mode="lines",
                    name=labels.get("expected_textbook", "textbook (verify = 1 step)"),
                    line=dict(color=PLAIN_COLOUR if with_cost else SPEED_COLOUR, dash="dash" if with_cost else "solid"))
    best_y = main.speedup[main.gammas.index(main.best)]
    fig.add_scatter(x=[main.best], y=[best_y], mode="markers", name=f"best γ = {main.best}",
                    marker=dict(size=17, symbol="star", color=SPEED_COLOUR, line=dict(width=1, color="white")))
    fig.add_scatter(x=[gamma], y=[_curve_at(main, gamma)], mode="markers", name=f"this run's γ = {gamma:.3g}",
                    marker=dict(size=14, symbol="circle-open", color=SPEED_COLOUR, line=dict(width=3)))
    if measured is not None:
        fig.add_scatter(x=[gamma], y=[measured], mode="markers", name=labels.get("measured", "measured"),
                        marker=dict(size=13, symbol="x", color="#D55E00"))
    fig.add_hline(y=1.0, line=dict(color=PLAIN_COLOUR, dash="dot", width=1))
    title = f"α = {main.alpha:.2f}, c = {main.c:.2f}: best γ ≈ {main.best}"
    fig = layout(fig, 330, font_size, legend_below=True, title=dict(text=title, x=0, y=0.97, font=dict(size=font_size + 1)),
                  xaxis=dict(title="γ", dtick=1), yaxis=dict(title=labels.get("speedup", "speed-up"), ticksuffix="×",
                                                            rangemode="tozero"))
    return fig.update_layout(legend=dict(y=-0.25), margin=dict(t=44, b=10))


def tradeoff_sentence(textbook: Curves, with_cost: Curves | None, fit_steps: float | None, gamma: float,
                      measured: float | None) -> str:
    """One sentence, from the numbers, on how the measured verify cost moves the curve and the best γ."""
    book = _curve_at(textbook, gamma)
    said = f"this run measured {measured:.2f}×" if measured is not None else "the measurement is still running"
    if with_cost is None or fit_steps is None:
        return f"The textbook curve expects {book:.2f}× at γ = {gamma:.3g}; {said}."
    cost = _curve_at(with_cost, gamma)
    dearer = ("more than" if fit_steps > 1.05 else "less than" if fit_steps < 0.95 else "about the same as")
    return (f"Here one check of γ + 1 = {gamma + 1:.3g} tokens cost {fit_steps:.2f} one-token target steps "
            f"({dearer} the textbook's 1 step): so the dashed textbook curve expects {book:.2f}× at this γ, "
            f"the solid curve with the measured cost {cost:.2f}×, and {said}. "
            f"Best γ: {with_cost.best} with the measured cost, {textbook.best} by the textbook.")


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


def cannot_pay_line(trade: RunTradeoff, device: str) -> str | None:
    """A warning, from this run's own α and c, when the draft model cannot pay on this device (else None)."""
    expected = trade.expected() or trade.expected(with_cost=False)
    if expected is None or expected >= 1.0:
        return None
    c = trade.textbook.c
    bound = best_case_speedup(trade.gamma, c, trade.verify_steps or 1.0)
    return (f"On this {device.upper()} the draft model cannot pay: one of its steps costs c = {c:.2f} of a target step, "
            f"so even with every guess accepted γ = {trade.gamma:.3g} would give at most {bound:.2f}×, and this run's "
            f"acceptance gives about {expected:.2f}× (measured: "
            f"{'–' if trade.measured is None else f'{trade.measured:.2f}×'}). Try the sidebar's drafter "
            "**prompt lookup**: it guesses by copying from the prompt, at almost no cost (c ≈ 0).")


def helper_rows(rows: Sequence[tuple[str, str, Any]]) -> pd.DataFrame | None:
    """The head's D5 table: per run (a label, its drafter, its Comparison or None) α, c, tokens per call and speed-up."""
    out = []
    for label, drafter, cmp in rows:
        if cmp is None:
            continue
        out.append({"run": label, "helper": drafters.spec(drafter).title, "α (accepted ÷ checked)": cmp.alpha_checked,
                    "c (guess cost ÷ target step)": cmp.c, "tokens / target call": cmp.tokens_per_target_call,
                    "speed-up": cmp.speedup})
    return pd.DataFrame(out) if out else None


def start_heads(man: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The heads a head's training went on from, the first first (each manifest keeps its start head's record)."""
    chain = []
    start = man.get("started_from")
    while start:
        chain.append(start)
        start = start.get("started_from")
    return chain[::-1]


def _earlier_stage(start: Mapping[str, Any]) -> str:
    train = start.get("recipe", {}).get("train", {})
    how = ("on the target's real notes" if train.get("unroll", 1) == 1
           else f"guessing {train['unroll']} tokens ahead")
    return f"{train.get('steps', '?')} steps {how} (head {str(start.get('sha256', ''))[:12]}…)"


def _trained_prompts(rec: Mapping[str, Any], counts: Mapping[str, Any]) -> str:
    """The prompts trained on, beside all recorded: the first recording's last chunk is held out to score the head, and
    a further recording's prompts that open a held-out one are left out (the token count excludes both)."""
    records = [rec.get("record", {}), *rec.get("also_record", [])]
    if not all("prompts" in r for r in records):
        return "? prompts"
    total = sum(int(r["prompts"]) for r in records)
    first, chunk = int(records[0]["prompts"]), int(records[0].get("chunk") or 0)
    if chunk <= 0:  # an older manifest without the chunk size: the held-out part is not known
        return f"{total:,} prompts"
    held = RecordConfig(prompts=first, chunk=chunk).held_out  # the manifest's recording, held out as the trainer does
    left = int(counts.get("left_out_sequences", 0))
    why = f"{held:,} held out to score it" + (f", {left:,} left out because they open a held-out one" if left else "")
    return f"{total - held - left:,} prompts ({total:,} recorded: {why})"


def head_recipe_line(man: Mapping[str, Any]) -> str:
    """How the shipped head was trained, from its manifest (numbers only: no model text)."""
    rec, train = man.get("recipe", {}), man.get("recipe", {}).get("train", {})
    held = man.get("held_out", {})
    counts = man.get("counts", {})
    acc = held.get("sampled_acceptance", [None, None])[-1]
    greedy = held.get("greedy_agreement", [None, None])[-1]
    by_guess = [g[-1] for g in held.get("by_guess", {}).get("greedy_agreement", [])]
    if len(by_guess) > 1:
        scored = (f" On held-out text its first {len(by_guess)} guesses in a row agreed with the target's top token "
                  + " / ".join(f"{g:.0%}" for g in by_guess) + f" of the time (the first reads the target's real "
                  f"notes, the later ones its own guessed notes); its first guess's sampled acceptance was {acc:.2f}.")
    elif acc is not None and greedy is not None:
        scored = (f" On held-out text it agreed with the target's top token {greedy:.0%} of the time and its sampled "
                  f"acceptance was {acc:.2f}.")
    else:
        scored = ""
    text = f" and {counts['text_tokens']:,} tokens of code it read" if counts.get("text_tokens") else ""
    unroll = train.get("unroll", 1)
    prompts = _trained_prompts(rec, counts)
    steps = (f"{train.get('steps', '?')} steps of {train.get('batch', '?')}×{train.get('window', '?')} positions"
             + (f", each guessing {unroll} tokens ahead on its own guesses (EAGLE-3's training-time test)" if unroll > 1 else ""))
    earlier = start_heads(man)
    if earlier:
        steps = ", then ".join([*(_earlier_stage(m) for m in earlier), steps])
    stage = {1: "second", 2: "third"}.get(len(earlier), f"{len(earlier) + 1}th")
    return (f"How this head was trained: {counts.get('recorded_tokens', 0):,} tokens of the target's own continuations "
            f"of {prompts}{text}, {steps}, seed {train.get('seed', '?')}, "
            f"{man.get('seconds', 0) / 60:.0f} min{f' for the {stage} stage' if earlier else ''} on "
            f"{man.get('trained_on', {}).get('machine', 'this machine')}; a "
            f"draft vocabulary of {rec.get('vocab', '?'):,} ids; {man.get('bytes', 0) / 1e6:.0f} MB, sha256 "
            f"{str(man.get('sha256', ''))[:12]}….{scored}")


def head_gpu_line(costs: GpuCosts | None, estimates: Sequence[tuple[str, str, float]] = ()) -> str:
    """The GPU case for the head, saying what was measured where; estimates: (run label, helper title, speed-up)."""
    if costs is None:
        return ("On a GPU: the 0.5B draft model's step costs 85–95 % of the 1.5B target's on an NVIDIA H200 (measured "
                "there), so it cannot pay. The head's step on a GPU has not been measured, so no GPU speed-up is claimed.")
    runs = "; ".join(f"{label} ({helper}) about {x:.2f}×" for label, helper, x in estimates)
    return (f"On a GPU ({costs.device}, {costs.precision}, medians of {costs.runs} runs, measured there on the "
            f"qwen-coder shapes with random weights): a target step takes {costs.target_step_ms:.1f} ms, the head's "
            f"step {costs.head_step_ms[1]:.2f} ms (c = {costs.c_head:.3f}), the 0.5B draft model's "
            f"{costs.draft_step_ms:.1f} ms (c = {costs.c_draft:.2f}), and one pass checking up to 16 tokens "
            f"{min(costs.verify_ms.values()):.1f}–{max(costs.verify_ms.values()):.1f} ms: kernel launches, not "
            "arithmetic, set the price, so a 1-layer helper is cheap there and a 24-layer one is not. "
            + (f"Replaying this page's rounds (what the target accepted here, on real weights, on this CPU) at those "
               f"costs: {runs}. The costs were measured on the GPU, the acceptance here; the speed-up is their "
               "product, not a run on the GPU." if runs else "")).strip()
