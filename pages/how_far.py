"""How far to guess: measure the speed-up at several γ, and compare it with Leviathan's curves."""

from __future__ import annotations

import streamlit as st

from specviz.app import jobs
from specviz.app.pairs import pair_or_message
from specviz.app.prompt import encode, preset_buttons, repaired_prompt
from specviz.app.settings import Settings
from specviz.app.shell import chart, font_size, lesson_md, run_page
from specviz.app.sidebar import settings
from specviz.labs import how_far
from specviz.labs.how_far import ALPHA_RANGE, C_RANGE, Sweep, SweepConfig
from specviz.presets import DEFAULT_PRESET, get_preset
from specviz.viz import how_far as how_far_view
from specviz.viz import strip

P = "how_far."  # session_state prefix of this page
MAX_PROMPT_CHARS = 20_000
SLIDER_START = (0.8, 0.1)  # the sliders before anything was measured: a good draft, a cheap one
SLOT = jobs.Slot(P + "key", ("Measuring γ",), "Measure", changed=(
    "The prompt, γ values or settings changed since this measurement. Press **{button}** to run them; "
    "until then the previous measurement stays on screen."))
ss = st.session_state


def _init_state() -> None:
    ss.setdefault(P + "prompt", get_preset(DEFAULT_PRESET).prompt)
    ss.setdefault(P + "gammas", list(how_far.DEFAULT_GAMMAS))
    ss.setdefault(P + "alpha", SLIDER_START[0])
    ss.setdefault(P + "c", SLIDER_START[1])


def _use_preset(preset_id: str) -> None:
    ss[P + "prompt"] = get_preset(preset_id).prompt


def _request_run() -> None:
    ss[P + "run_request"] = True


def _reset_sliders(alpha: float, c: float) -> None:
    ss[P + "alpha"], ss[P + "c"] = alpha, c


# ------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------


def _header(s: Settings) -> None:
    st.title("How far should the helper guess?" if s.level == "d1" else "How far to guess")
    lesson_md(s.level, "howfar_intro")


def _prompt_box() -> str:
    preset_buttons(P, _use_preset)
    return st.text_area("Prompt (the models continue this text)", key=P + "prompt", height=100,
                        max_chars=MAX_PROMPT_CHARS, persist_state="session")


def _gamma_picker(s: Settings) -> list[int]:
    label = "How many guesses per turn to try" if s.level == "d1" else "γ values to measure (one speculative run each)"
    return st.multiselect(label, how_far.GAMMA_CHOICES, key=P + "gammas", persist_state="session",
                          help="Each γ is one more speculative run of the same prompt; 1, 2, 4 and 8 take about a "
                               "minute on qwen-coder on this CPU (64 tokens).")


def _plan(cfg: SweepConfig, s: Settings) -> None:
    who = "prompt lookup (n-gram)" if cfg.drafter == "ngram" else "the small draft model"
    mode = "greedy" if cfg.sampling.greedy else f"sampling (T = {cfg.sampling.temperature:g}, seed {cfg.sampling.seed})"
    st.caption(f"Plan: the target alone once, then one speculative run at each γ = {', '.join(map(str, cfg.gammas))} "
               f"({cfg.runs} runs of up to {cfg.max_new_tokens} tokens), drafter: {who}, {mode}. "
               "Sidebar settings apply, except γ (chosen here)"
               + (" and adaptive γ (off here: this lab measures fixed γ)." if s.adaptive else "."))


def _job_key(cfg: SweepConfig) -> jobs.Key:
    return ("how_far", cfg)


# ------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------


def _metrics(sweep: Sweep, s: Settings) -> None:
    best = sweep.best_measured
    curves = how_far.measured_curves(sweep)
    lev = curves.best if curves else None
    if s.level == "d1":
        if best is not None and best.speedup:
            st.markdown(f"The fastest was **{best.gamma} {'guess' if best.gamma == 1 else 'guesses'} per turn**: "
                        f"with it the answer came **{strip.speed_words(best.speedup)}** "
                        f"({best.speedup:.1f} times as fast as the big model alone).")
        return
    slots = [st.container() for _ in range(5)] if s.presenter else list(st.columns(5))  # large type needs the width
    slots[0].metric("α (measured)", f"{sweep.alpha:.2f}" if sweep.alpha is not None else "–",
                    help="Accepted ÷ checked drafted tokens, pooled over every γ run (a drafted token after a "
                         "rejection is never checked, so it does not count here).")
    slots[1].metric("c (measured)", f"{sweep.c:.3f}" if sweep.c is not None else "–",
                    help="Draft ms per drafted token ÷ one target step (median step of the target-only run).")
    slots[2].metric("target step", f"{sweep.target_step_ms:.0f} ms" if sweep.target_step_ms else "–",
                    help="Median time of one target forward for one new token, measured on this machine.")
    slots[3].metric("best γ (Leviathan)", str(lev) if lev else "–")
    slots[4].metric("best γ (measured)", f"{best.gamma} ({best.speedup:.2f}×)" if best and best.speedup else "–")


def _sliders(sweep: Sweep | None) -> tuple[float, float]:
    """α and c sliders: they start on the measurement and only change the chart, never the runs."""
    measured = how_far.slider_start(sweep)
    if measured and ss.get(P + "synced") != ss.get(SLOT.state_key):
        _reset_sliders(*measured)
        ss[P + "synced"] = ss.get(SLOT.state_key)
    left, mid, right = st.columns([3, 3, 2], vertical_alignment="bottom")
    alpha = left.slider("α — chance a guess is accepted", *ALPHA_RANGE, step=0.01, key=P + "alpha", persist_state="session",
                        help="Explore beyond the measurement: the curves follow; nothing is re-run.")
    c = mid.slider("c — one draft token's cost in target steps", *C_RANGE, step=0.01, key=P + "c", persist_state="session")
    if measured:
        right.button("Back to the measured α and c", key=P + "reset", on_click=_reset_sliders, args=measured)
    return alpha, c


def _chart(sweep: Sweep | None, s: Settings, slider: tuple[float, float] | None) -> None:
    measured = how_far.measured_curves(sweep) if sweep is not None else None
    verify = how_far.measured_verify_curve(sweep) if sweep is not None and s.level == "d5" else None
    custom = how_far.slider_curves(sweep, *slider) if slider is not None else None
    if measured is None and custom is None:
        return
    points = sweep.points if sweep is not None else ()
    chart(how_far_view.how_far_figure(measured, points, custom, verify, s.level, font_size(s)), P + "chart")
    if custom is not None and measured is None:
        st.caption("Curves for the sliders' α and c only: press **Measure** to add this machine's measurement.")


def _table(sweep: Sweep, s: Settings) -> None:
    st.dataframe(how_far_view.sweep_table(sweep, s.level), hide_index=True)
    st.caption(f"Target alone: {sweep.baseline_ms_per_token:.0f} ms per token over {sweep.baseline_tokens} tokens "
               "(decode time; prompt reading not counted). Measured on this machine: a 2-core CPU, no GPU, "
               "sharing its cores with this page.")


def _honesty(sweep: Sweep, s: Settings) -> None:
    """What a verify pass really cost here, against Leviathan's one-step assumption."""
    costs = [p for p in sweep.points if p.verify_steps is not None]
    if not costs or s.level == "d1":
        return
    said = ", ".join(f"γ = {p.gamma}: {p.verify_steps:.1f}" for p in costs)
    st.markdown(f"**Measured here:** one checking pass of the target cost {said} one-token steps. "
                "Leviathan's formula counts every pass as 1 step, so the measured points sit below its curve "
                "when a pass costs more.")
    if s.level == "d5":
        fit = sweep.verify_fit
        if fit is not None:
            st.caption(f"Straight-line fit of the median verify cost: {fit.intercept:.2f} + {fit.slope:.3f}·n target "
                       f"steps for a pass scoring n tokens (measured up to n = {fit.max_scored}; beyond that the dotted "
                       "orange curve extrapolates).")
        chart(how_far_view.verify_cost_bars(sweep.points, font_size(s)), P + "verify")


def _lessons(s: Settings) -> None:
    if s.level == "d1":
        lesson_md("d1", "howfar_read")
        return
    with st.expander("How to read the chart", expanded=s.level == "d2"):
        lesson_md(s.level, "howfar_read")
    with st.expander("Honest CPU notes: what a verify pass costs here", expanded=s.level == "d5"):
        lesson_md(s.level, "howfar_cpu")


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def main() -> None:
    s = settings()
    _init_state()
    _header(s)
    text = repaired_prompt(_prompt_box())
    gammas = _gamma_picker(s)
    st.button("Measure", key=P + "run", icon=":material/play_arrow:", type="primary", on_click=_request_run)
    requested = ss.pop(P + "run_request", False)

    pair = pair_or_message(s.pair)
    if pair is None:
        return
    prompt = encode(pair, text)
    problem = prompt.problem(s.max_new_tokens) or (None if gammas else "Choose at least one γ to measure.")
    current = None
    if problem:
        st.info(problem, icon=":material/edit:")
    else:
        cfg = how_far.sweep_config(s, text, gammas)
        _plan(cfg, s)
        current = (_job_key(cfg),)
        if requested:
            jobs.start(SLOT, {current[0]: lambda: how_far.sweep_steps(pair, prompt.ids, cfg)})
    done = jobs.results(SLOT, current)
    sweep: Sweep | None = done[0] if done else None

    st.divider()
    if sweep is not None:
        st.subheader("What this machine measured" if s.level != "d1" else "What happened")
        _metrics(sweep, s)
    slider = _sliders(sweep) if s.level != "d1" else None
    _chart(sweep, s, slider)
    if sweep is not None and s.level != "d1":
        _table(sweep, s)
        _honesty(sweep, s)
    elif sweep is None and s.level == "d1":
        st.caption("Press **Measure** to race the helper at different numbers of guesses.")
    _lessons(s)


run_page(main)
