"""Why checking is cheap: time one target pass over 1–16 new tokens, and what batching leaves of the speed-up."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pandas as pd
import streamlit as st

from specviz.app import ui
from specviz.app.policy import bounded
from specviz.app.runner import Job
from specviz.core.progress import JobSteps
from specviz.app.settings import Settings
from specviz.labs.why_cheap import (
    GPU_FIGURES, NOISY_SPREAD, REPEATS_RANGE, BatchConfig, BatchEffect, PassCost, PassCostConfig, Reference,
    load_reference, measure_batch_effect, measure_pass_cost,
)
from specviz.viz import why_cheap as why_cheap_view
from specviz.viz.strip import speed_words

P = "why_cheap."  # session_state prefix of this page
GPU_COMMAND = ("python -m specviz why-cheap --pair qwen-coder --device cuda --batches 1,2,4,8,16,32,64,128 --json "
               "--note 'GPU name, date' > assets/verify_cost_gpu.json")
ss = st.session_state


# ------------------------------------------------------------------------------------------
# Jobs: keys of plain values, submitted on a button press, shown from any session that asked
# ------------------------------------------------------------------------------------------


def pass_key(pair: str, repeats: int) -> tuple[Any, ...]:
    """The runner key of a pass-cost measurement (the view never enters it)."""
    return ("why_cheap.pass", pair, PassCostConfig(repeats=repeats))


def batch_key(pair: str, s: Settings, repeats: int) -> tuple[Any, ...]:
    """The runner key of a batch-effect measurement: γ and decoding set α, so they are part of it."""
    return ("why_cheap.batch", pair, BatchConfig(gamma=s.gamma, sampling=s.sampling, repeats=repeats))


def _shown_job(slot: str, key: tuple[Any, ...], pressed: bool, s: Settings,
               make: Callable[[Any], JobSteps]) -> tuple[Job | None, tuple[Any, ...] | None]:
    """The job this section shows: submitted on a press, else the last one asked for, else one on record for `key`."""
    if pressed:
        pair = ui.pair_or_message(s.pair, key=P + "retry")
        if pair is not None and (j := ui.submit_job(key, lambda: make(pair))) is not None:
            ss[P + slot] = key
    shown = ss.get(P + slot)
    if shown != key and (j := ui.job(key)) is not None and j.view().state == "done":
        shown = ss[P + slot] = key  # measured already (by anyone) with these settings: show it, run nothing
    return (ui.job(shown) if shown is not None else None), shown


def _result(slot: str, key: tuple[Any, ...], pressed: bool, s: Settings, make: Callable[[Any], JobSteps],
            what: str, changed_note: str) -> Any:
    """Submit/poll a section's job; return its result once done (None while running or never asked)."""
    j, shown = _shown_job(slot, key, pressed, s, make)
    if shown is None:
        return None
    if j is None:
        st.info("That measurement is no longer in memory: press the button to measure again.")
        return None
    view = j.view()
    if not view.finished:
        ui.poll_jobs([shown], [what])
        return None
    if view.state != "done":
        ui.show_job_status(j, view, what)
        return None
    if shown != key:
        st.info(changed_note, icon=":material/sync:")
    return view.result


def _chart(fig: Any, key: str) -> None:
    st.plotly_chart(fig, key=P + key, config={"displayModeBar": False})


# ------------------------------------------------------------------------------------------
# Section 1: one pass, more new tokens
# ------------------------------------------------------------------------------------------


def _pass_words(cost: PassCost, s: Settings) -> str:
    r = dict(zip(cost.ks, cost.ratios))
    top = cost.ks[-1]
    if s.level == "d1":
        said = f"Checking **{top} words at once** took **{r[top]:.1f} times** as long as writing one word"
        if r[top] <= top / 2:
            return f"{said} — not {top} times. Reading the book is the slow part!"
        return f"{said}. On this small computer the extra words were not cheap this time."
    parts = ", ".join(f"{k} tokens ≈ **{r[k]:.1f}**" for k in cost.ks if k > 1)
    return (f"One plain decoding step (1 new token) took **{cost.step_ms:.0f} ms** here. In one-token steps, a "
            f"single pass over {parts} — if the cost grew with the tokens, {top} tokens would cost {top}.")


def _pass_table(cost: PassCost) -> pd.DataFrame:
    return pd.DataFrame({
        "new tokens": list(cost.ks),
        "median ms": [round(m, 1) for m in cost.median_ms],
        "fastest ms": [round(min(t), 1) for t in cost.times_ms],
        "slowest ms": [round(max(t), 1) for t in cost.times_ms],
        "× one-token step": [round(x, 2) for x in cost.ratios],
        "ms per token": [round(m / k, 1) for m, k in zip(cost.median_ms, cost.ks)],
    })


def _pass_section(s: Settings, reference: Reference | None) -> None:
    d1 = s.level == "d1"
    st.subheader("How long does checking take?" if d1 else "One pass, more new tokens")
    ui.lesson_md(s.level, "cheap_pass")
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        pressed = st.button("Time the big model" if d1 else "Measure pass times", key=P + "go_pass",
                            icon=":material/timer:", type="primary")
        repeats = st.number_input("Repeats per point (median shown)", *REPEATS_RANGE, value=5, step=1,
                                  key=P + "pass_repeats", width=220,
                                  help="More repeats steady the figures; each repeat is one pass per size (about "
                                  "2–3 s with the Qwen pair on this CPU).")
    key = pass_key(s.pair, bounded(repeats, *REPEATS_RANGE, 5))  # the widget's range, held again here
    config = key[2]
    cost = _result("pass", key, pressed, s, lambda pair: measure_pass_cost(pair.target, pair.tokenizer, s.pair, config),
                   "Timing the target's passes", "The repeats or the pair changed since this measurement: press "
                   "the button to measure them; the previous figures stay until then.")
    if cost is None:
        return
    st.markdown(_pass_words(cost, s))
    fs = ui.font_size(s)
    if d1:
        _chart(why_cheap_view.pass_time_figure(cost, fs, x_title="words checked at once", y_title="time (milliseconds)",
                                         measured_name="what the stopwatch said",
                                         linear_name="if every word cost a whole reading"), "pass_time")
    else:
        left, right = st.columns(2, gap="medium")
        with left:
            _chart(why_cheap_view.pass_time_figure(cost, fs), "pass_time")
        with right:
            ref = reference.pass_cost if reference else None
            _chart(why_cheap_view.pass_ratio_figure(cost, ref, fs), "pass_ratio")
    _noise_note(cost.spread, s)
    if s.level == "d5":
        st.dataframe(_pass_table(cost), hide_index=True)
    st.caption(_machine_line(cost.machine.device, cost.machine.name, cost.machine.threads, cost.pair,
                             cost.context_tokens))


def _noise_note(spread: float, s: Settings) -> None:
    """Say so when repeats disagree: on a shared server another program may have used the cores meanwhile."""
    if spread <= NOISY_SPREAD:
        return
    if s.level == "d1":
        st.warning("The stopwatch gave quite different times on different tries — the computer was busy with "
                   "something else for a moment. Try again later for steadier numbers.", icon=":material/timer_off:")
        return
    st.warning(f"The repeats disagree (slowest ÷ fastest up to {spread:.1f}×): something else used this machine's "
               "cores during the measurement. Medians resist a few disturbed repeats, not many; measure again "
               "with more repeats when the server is quiet.", icon=":material/timer_off:")


def _machine_line(device: str, name: str, threads: int, pair: str, context: int) -> str:
    where = f"this server's CPU ({name}; {threads} threads), no GPU" if device == "cpu" else f"a GPU ({name})"
    return f"Measured on {where}, pair {pair}, with {context} tokens already in the KV cache."


# ------------------------------------------------------------------------------------------
# Section 2: the batch effect
# ------------------------------------------------------------------------------------------


def _batch_words(effect: BatchEffect, s: Settings) -> str:
    sp = effect.speedups
    first, last = effect.points[0], effect.points[-1]
    if s.level == "d1":
        one = effect.run_speedup if effect.run_speedup is not None else sp[0]  # the real run, timed end to end
        return (f"Writing **one** story at a time, the helper made it {speed_words(one)}. "
                f"Writing **{last.batch}** stories at once, it would make it {speed_words(sp[-1])}.")
    a = f"{effect.alpha:.0%}" if effect.alpha is not None else "–"
    real = f"{effect.run_speedup:.2f}×" if effect.run_speedup is not None else "–"
    grow = (f"A verify pass of {effect.gamma + 1} tokens cost **{first.verify_ratio:.2f}** one-token steps at batch "
            f"{first.batch} and **{last.verify_ratio:.2f}** at batch {last.batch}.")
    sps = " → ".join(f"{x:.2f}×" if x is not None else "–" for x in sp)
    tpc = f"{effect.run_tokens_per_call:.2f}" if effect.run_tokens_per_call is not None else "–"
    if s.level == "d5":
        real += f" with {tpc} tokens per target call and c = {effect.c:.3f}" if effect.c is not None else ""
    return (f"Short real run at batch 1 (γ = {effect.gamma}): acceptance α = **{a}**, measured speed-up **{real}**. "
            f"{grow} Expected speed-up at batch sizes {', '.join(str(p.batch) for p in effect.points)}: **{sps}**.")


def _batch_table(effect: BatchEffect) -> pd.DataFrame:
    ps = effect.points
    return pd.DataFrame({
        "batch": [p.batch for p in ps],
        "step ms": [round(statistics.median(p.step_ms), 1) for p in ps],
        f"verify ms (γ+1 = {effect.gamma + 1})": [round(statistics.median(p.verify_ms), 1) for p in ps],
        "r = verify ÷ step": [round(p.verify_ratio, 2) for p in ps],
        "draft step ms": [round(statistics.median(p.draft_ms), 1) for p in ps],
        "c(b)": [round(c, 3) if (c := effect.c_at(p)) is not None else None for p in ps],
        "expected speed-up": [round(x, 2) if x is not None else None for x in effect.speedups],
    })


def _batch_section(s: Settings, reference: Reference | None) -> None:
    d1 = s.level == "d1"
    st.subheader("Many stories at once" if d1 else "Busy servers: the batch effect")
    ui.lesson_md(s.level, "cheap_batch")
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        pressed = st.button("Try many at once" if d1 else "Measure the batch effect", key=P + "go_batch",
                            icon=":material/stacks:", type="primary")
        repeats = st.number_input("Repeats per batch size", *REPEATS_RANGE, value=3, step=1, key=P + "batch_repeats",
                                  width=220, help="Each repeat times a step, a verify pass and a draft step at every "
                                  "batch size (about 6 s per repeat with the Qwen pair on this CPU).")
    if not d1:
        st.caption(f"Uses the sidebar's γ = {s.gamma} and decoding mode; always drafts with the pair's small model "
                   "(batching is about models). Batch sizes 1, 2, 4, 8 — fewer if memory would not allow them.")
    key = batch_key(s.pair, s, bounded(repeats, *REPEATS_RANGE, 3))
    config = key[2]
    effect = _result("batch", key, pressed, s, lambda pair: measure_batch_effect(
        pair.target, pair.draft, pair.tokenizer, pair.eos_ids, s.pair, config),
        "Measuring the batch effect", "γ, the decoding mode, the repeats or the pair changed since this "
        "measurement: press the button to measure them; the previous figures stay until then.")
    if effect is None:
        return
    if not effect.points:
        st.warning(f"No batch size could be measured: {effect.stopped}.")
        return
    st.markdown(_batch_words(effect, s))
    fs = ui.font_size(s)
    ref = reference.batch_effect if reference else None
    if d1:
        _chart(why_cheap_view.batch_speedup_figure(effect, None, fs, x_title="stories written at once",
                                             y_title="how much faster with the helper (×)"), "batch_speedup")
    else:
        left, right = st.columns(2, gap="medium")
        with left:
            _chart(why_cheap_view.batch_speedup_figure(effect, ref, fs), "batch_speedup")
        with right:
            _chart(why_cheap_view.batch_cost_figure(effect, fs), "batch_cost")
    _noise_note(effect.spread, s)
    if effect.stopped:
        st.caption(f":material/memory: {effect.stopped}.")
    if not d1:
        st.info("Computed from **measured pass times**, not a batched speculative run: α and c come from a real "
                "run at batch 1, and the verify cost r(b) from timed passes at each batch size, put into Leviathan's "
                "formula. The green star is the real run's measured speed-up, for comparison.",
                icon=":material/functions:")
    if s.level == "d5":
        st.dataframe(_batch_table(effect), hide_index=True)
    st.caption(_machine_line(effect.machine.device, effect.machine.name, effect.machine.threads, effect.pair,
                             effect.context_tokens))


# ------------------------------------------------------------------------------------------
# Section 3: this CPU and a GPU
# ------------------------------------------------------------------------------------------


def _hardware_section(s: Settings, reference: Reference | None) -> None:
    st.subheader("This computer" if s.level == "d1" else "What this CPU shows, and what a GPU would show")
    ui.lesson_md(s.level, "cheap_hardware")
    if s.level == "d1":
        return
    if reference is None:
        st.info("**No GPU figures measured yet.** None was lent to this project so far; the numbers above are "
                "this CPU's only. The same code measures a GPU in one command:", icon=":material/developer_board:")
        st.code(GPU_COMMAND, language="bash")
        st.caption(f"Saved as `{GPU_FIGURES.name}` in `assets/`, the GPU curves appear in the charts above next to "
                   "this machine's.")
        return
    parts = [p for p in (reference.pass_cost, reference.batch_effect) if p is not None]
    machine = parts[0].machine if parts else None
    st.success(f"GPU figures measured with the same code on {machine.name if machine else 'a GPU'} "
               f"({reference.note or 'no note'}); they are drawn in orange in the charts above.",
               icon=":material/developer_board:")
    if reference.pass_cost is not None:
        st.dataframe(_pass_table(reference.pass_cost), hide_index=True)


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def main() -> None:
    s = ui.settings()
    st.title("Why checking is cheap" if s.level != "d1" else "Why checking is quick")
    ui.lesson_md(s.level, "cheap_intro")
    if s.level == "d2":
        st.image(str(ui.ASSETS / "memory.svg"), width=640)
    try:
        reference = load_reference()
    except (ValueError, KeyError, TypeError) as exc:  # a hand-edited figures file must not break the page
        ui.log.warning("GPU figures ignored", exc_info=exc)
        st.warning(f"Ignored `{GPU_FIGURES.name}`: it is not a measurement file.")
        reference = None
    _pass_section(s, reference)
    st.divider()
    _batch_section(s, reference)
    st.divider()
    _hardware_section(s, reference)


ui.run_page(main)
