"""How far to guess: measure the speed-up at several γ, and compare it with Leviathan's curves."""

from __future__ import annotations

import streamlit as st

from specviz import host
from specviz.core import drafters
from specviz.app import jobs
from specviz.app.pairs import pair_or_message
from specviz.app.prompt import encode, preset_buttons, repaired_prompt
from specviz.settings import Settings
from specviz.app.shell import chart, font_size, lesson_md, run_page, table
from specviz.app.sidebar import settings
from specviz.labs import chain_or_tree, how_far, ranking
from specviz.labs.how_far import ALPHA_RANGE, C_RANGE, Sweep, SweepConfig
from specviz.app import predict
from specviz.app.settings import cut_long_prompt
from specviz.viz import export
from specviz.viz import predict as predict_view
from specviz.presets import DEFAULT_PRESET, get_preset
from specviz.viz import chain_or_tree as chain_or_tree_view
from specviz.viz import how_far as how_far_view

P = "how_far."  # session_state prefix of this page
SLIDER_START = (0.8, 0.1)  # the sliders before anything was measured: a good draft, a cheap one
SLOT = jobs.Slot(P + "key", ("Measuring γ",), "Measure", changed=(
    "The prompt, γ values or settings changed since this measurement. Press **{button}** to run them; "
    "until then the previous measurement stays on screen."))
SHAPE_SLOT = jobs.Slot(P + "shape_key", ("Chain and tree runs",), "Compare chain and tree", changed=(
    "The sizes or settings changed since this comparison. Press **{button}** to run them; "
    "until then the previous comparison stays on screen."), adopt=False)  # a visitor sees it after their own press
ss = st.session_state


def _init_state() -> None:
    ss.setdefault(P + "prompt", get_preset(DEFAULT_PRESET).prompt)
    ss.setdefault(P + "gammas", list(how_far.DEFAULT_GAMMAS))
    ss.setdefault(P + "alpha", SLIDER_START[0])
    ss.setdefault(P + "c", SLIDER_START[1])
    ss.setdefault(P + "shape_sizes", list(chain_or_tree.DEFAULT_SIZES))


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
    prompt = st.text_area("Prompt (the models continue this text)", key=P + "prompt", height=100,
                          on_change=cut_long_prompt, args=(ss, P + "prompt"), persist_state="session")
    if note := ss.pop(P + "prompt.note", None):
        st.warning(note, icon=":material/content_cut:")
    return prompt


def _gamma_picker(s: Settings) -> list[int]:
    label = "How many guesses per turn to try" if s.level == "d1" else "γ values to measure (one speculative run each, every round)"
    return st.multiselect(label, how_far.GAMMA_CHOICES, key=P + "gammas", persist_state="session",
                          help="Each one is one more run of the same prompt with the helper: the time grows with "
                               "the number of runs (the progress bar counts them).")


def _plan(cfg: SweepConfig, s: Settings) -> None:
    if s.level == "d1":
        st.caption(f"Plan: the big model writes alone, then with its helper for each number of guesses "
                   f"({', '.join(map(str, cfg.gammas))}); all of that {cfg.repeats} times over: {cfg.runs} races of "
                   f"up to {cfg.max_new_tokens} words.")
        return
    who = drafters.spec(cfg.drafter).title
    mode = "greedy" if cfg.sampling.greedy else f"sampling (T = {cfg.sampling.temperature:g}, seed {cfg.sampling.seed})"
    st.caption(f"Plan: the target alone, then one speculative run at each γ = {', '.join(map(str, cfg.gammas))}; "
               f"that round {cfg.repeats} times, one after another ({cfg.runs} runs of up to {cfg.max_new_tokens} "
               f"tokens), drafter: {who}, {mode}. Sidebar settings apply, except γ (chosen here)"
               + (" and adaptive γ (off here: this lab measures fixed γ)" if s.adaptive else "")
               + (f" and the length (at most {how_far.PAGE_TOKENS} tokens a run here, so that the repeats fit the "
                  "minute)." if s.max_new_tokens > cfg.max_new_tokens else "."))


def _job_key(cfg: SweepConfig) -> jobs.Key:
    return ("how_far", cfg)


# ------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------


def _metrics(sweep: Sweep, s: Settings) -> None:
    best = sweep.best_measured
    lead = sweep.leaders()
    curves = how_far.main_curves(sweep)  # the best γ of the main curve: with the measured verify cost
    lev = curves.best if curves else None
    if s.level == "d1":
        if best is not None and best.speedup:
            st.markdown(how_far_view.fastest_words(lead))
        return
    slots = [st.container() for _ in range(5)] if s.presenter else list(st.columns(5))  # large type needs the width
    slots[0].metric("α (measured)", f"{sweep.alpha:.2f}" if sweep.alpha is not None else "–",
                    help="Accepted ÷ checked drafted tokens, pooled over every γ run (a drafted token after a "
                         "rejection is never checked, so it does not count here).")
    slots[1].metric("c (measured)", f"{sweep.c:.3f}" if sweep.c is not None else "–",
                    help="Draft ms per drafted token ÷ one target step (median step of the target-only run).")
    slots[2].metric("target step", f"{sweep.target_step_ms:.0f} ms" if sweep.target_step_ms else "–",
                    help="Median time of one target forward for one new token, measured on this machine.")
    slots[3].metric("best γ (expected)", str(lev) if lev else "–",
                    help="The peak of the main curve: Leviathan's formula with the measured cost of a verify pass.")
    slots[4].metric("best γ (measured)", " ≈ ".join(str(p.gamma) for p in lead) + f" ({best.speedup:.2f}×)"
                    if best and best.speedup else "–",
                    help=f"Several γ joined by ≈ came within {sweep.margin:.0%} of the fastest (the widest spread of "
                         "one γ's own runs, never below 10 %): about the same.")


def _sliders(sweep: Sweep | None) -> tuple[float, float]:
    """α and c sliders: they start on the measurement and only change the chart, never the runs."""
    measured = how_far.slider_start(sweep)
    if measured and ss.get(P + "synced") != ss.get(SLOT.state_key):
        _reset_sliders(*measured)
        ss[P + "synced"] = ss.get(SLOT.state_key)
    left, mid = st.columns(2, vertical_alignment="bottom")  # the reset button below: a third column cut its label
    alpha = left.slider("α — chance a guess is accepted", *ALPHA_RANGE, step=0.01, key=P + "alpha", persist_state="session",
                        help="Explore beyond the measurement: the curves follow; nothing is re-run.")
    c = mid.slider("c — one draft token's cost in target steps", *C_RANGE, step=0.01, key=P + "c", persist_state="session")
    if measured:
        st.button("Back to the measured α and c", key=P + "reset", on_click=_reset_sliders, args=measured)
    return alpha, c


def _chart(sweep: Sweep | None, s: Settings, slider: tuple[float, float] | None) -> None:
    measured = how_far.measured_curves(sweep) if sweep is not None else None
    verify = how_far.verify_curves(sweep) if sweep is not None else None
    custom = how_far.slider_curves(sweep, *slider) if slider is not None else None
    if measured is None and custom is None:
        return
    points = sweep.points if sweep is not None else ()
    chart(how_far_view.how_far_figure(measured, points, custom, verify, s.level, font_size(s)), P + "chart")
    if custom is not None and measured is None:
        st.caption("Curves for the sliders' α and c only: press **Measure** to add this machine's measurement.")


def _table(sweep: Sweep, s: Settings) -> None:
    table(how_far_view.sweep_table(sweep, s.level))
    if noise := how_far_view.noise_words(sweep, s.level):
        st.caption(noise)
    st.download_button("Download the measurement (JSON)", export.record_json(sweep), file_name="specviz-how-far.json",
                       mime="application/json", icon=":material/download:", key=P + "json")
    st.caption(f"Target alone: {sweep.baseline_ms_per_token:.0f} ms per token over {sweep.baseline_tokens} tokens "
               f"(decode time; prompt reading not counted). Measured on this machine: {host.machine_words()}, "
               "sharing its cores with this page.")


def _honesty(sweep: Sweep, s: Settings) -> None:
    """What a verify pass really cost here, against Leviathan's one-step assumption."""
    costs = [p for p in sweep.points if p.verify_steps is not None]
    if not costs or s.level == "d1":
        return
    said = ", ".join(f"γ = {p.gamma}: {p.verify_steps:.1f}" for p in costs)
    textbook = how_far.leviathan_curves(sweep.alpha, sweep.c) if sweep.alpha is not None and sweep.c is not None else None
    verify = how_far.verify_cost_curves(sweep.alpha, sweep.c, sweep.verify_fit) if (
        textbook is not None and sweep.verify_fit is not None) else None
    where = how_far_view.curve_position_sentence(sweep.points, textbook, verify) if textbook is not None else ""
    st.markdown(f"**Measured here:** one checking pass of the target cost {said} one-token steps, where "
                f"Leviathan's formula counts every pass as 1 step. {where}")
    if s.level == "d5":
        fit = sweep.verify_fit
        if fit is not None:
            st.caption(f"Straight-line fit of the median verify cost: {fit.intercept:.2f} + {fit.slope:.3f}·n target "
                       f"steps for a pass scoring n tokens (measured up to n = {fit.max_scored}; beyond that the solid "
                       "main curve extrapolates).")
        chart(how_far_view.verify_cost_bars(sweep.points, font_size(s)), P + "verify")


def _positions(sweep: Sweep, s: Settings) -> None:
    """D5: per drafted position, how often the k-th guess was accepted at each γ (why a longer draft pays less)."""
    series = [(f"γ = {p.gamma}", p.acceptance_by_position) for p in sweep.points if p.acceptance_by_position]
    if s.level != "d5" or not series:
        return
    st.markdown("**Acceptance by position** (vLLM's per-position counters): of the rounds at each γ, the share "
                "that accepted their k-th guess.")
    chart(how_far_view.position_figure(series, font_size(s)), P + "positions")
    longest = max(sweep.points, key=lambda p: len(p.acceptance_by_position))
    said = how_far_view.position_sentence(longest.acceptance_by_position, longest.gamma)
    if said:
        st.caption(said)


def _lessons(s: Settings) -> None:
    if s.level == "d1":
        lesson_md("d1", "howfar_read")
        return
    with st.expander("How to read the chart", expanded=s.level == "d2"):
        lesson_md(s.level, "howfar_read")
    with st.expander("Honest CPU notes: what a verify pass costs here", expanded=s.level == "d5"):
        lesson_md(s.level, "howfar_cpu")


# ------------------------------------------------------------------------------------------
# Chain or tree: the same number of verified tokens, two shapes, two presets
# ------------------------------------------------------------------------------------------


def _request_shapes() -> None:
    ss[P + "shape_request"] = True


def _shape_section(pair, s: Settings) -> None:
    d1 = s.level == "d1"
    st.divider()
    st.subheader("One line of guesses, or a tree of them?" if d1 else "Chain or tree?")
    lesson_md(s.level, "chain_or_tree")
    sizes = st.pills("Guesses checked per turn" if d1 else "n: drafted tokens the target verifies per pass",
                     chain_or_tree.SIZE_CHOICES, selection_mode="multi", key=P + "shape_sizes", persist_state="session",
                     help="Each n is a chain of n guesses and a tree of n nodes, on both prompts.")
    helper = chain_or_tree.helper_for(s.drafter)
    if (no := chain_or_tree.why_not(pair, helper)) is not None:
        st.info(no, icon=":material/info:")
        return
    cfg, problem = None, None if sizes else "Choose at least one n to compare."
    if sizes:
        try:
            cfg = chain_or_tree.make_config(s.pair, sizes, s.sampling, helper)
        except ValueError as exc:
            problem = str(exc)
    if cfg is None:
        st.info(problem, icon=":material/edit:")
    else:
        mode = "greedy" if cfg.sampling.greedy else f"sampling (T = {cfg.sampling.temperature:g})"
        who = drafters.spec(cfg.helper).title
        if d1:
            st.caption(f"Plan: on a piece of code and on a story, the big model alone, then a line and a tree of "
                       f"each size ({', '.join(map(str, cfg.sizes))} guesses): {cfg.runs} races of "
                       f"{cfg.max_new_tokens} words.")
        else:
            st.caption(f"Plan: on the {' and '.join(chain_or_tree_view.preset_title(p) for p in cfg.presets)} presets, "
                       f"the target alone, then at each n = {', '.join(map(str, cfg.sizes))} a chain of n guesses and "
                       f"a tree of n nodes (branching {cfg.branching}, every node verified): {cfg.runs} runs of "
                       f"{cfg.max_new_tokens} tokens, {mode}; guessing: {who}.")
    st.button("Compare chain and tree" if not d1 else "Race the line and the tree", key=P + "shape_go",
              icon=":material/account_tree:", on_click=_request_shapes, disabled=cfg is None)
    key = ("how_far.shape", cfg) if cfg is not None else None
    if ss.pop(P + "shape_request", False) and cfg is not None:
        jobs.start(SHAPE_SLOT, {key: lambda: chain_or_tree.shape_steps(pair, cfg)})
    done = jobs.results(SHAPE_SLOT, (key,) if key else None)
    if not done:
        return
    result = done[0]
    st.markdown(chain_or_tree_view.verdict(result, s.level))
    chart(chain_or_tree_view.shape_figure(result, s.level, font_size(s)), P + "shape_chart")
    if not d1:
        table(chain_or_tree_view.shape_table(result), key=P + "shape_table")


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
    problem = (how_far.unsuited(s.drafter) or prompt.problem(s.max_new_tokens)
               or (None if gammas else "Choose at least one γ to measure."))
    current = None
    if problem:
        st.info(problem, icon=":material/edit:")
    else:
        cfg = how_far.sweep_config(s, text, gammas)
        _plan(cfg, s)
        current = (_job_key(cfg),)
        if requested:
            jobs.start(SLOT, {current[0]: lambda: how_far.sweep_steps(pair, prompt.ids, cfg)})
    # another visitor's sweep of these settings is shown only once this visitor has made their own prediction
    done = jobs.results(SLOT, current, adopt=predict.choice(P, predict_view.gamma_question(gammas)) is not None)
    sweep: Sweep | None = done[0] if done else None

    question = predict_view.gamma_question(sweep.config.gammas if sweep is not None else sorted(gammas), s.level)
    best = sweep.best_measured if sweep is not None else None
    if (best is None or best.speedup is None) and question.choices:
        predict.ask(P, question)
    st.divider()
    if sweep is not None:
        st.subheader("What this machine measured" if s.level != "d1" else "What happened")
        if best is not None and best.speedup is not None:
            tied = [(p.gamma, p.speedup) for p in sweep.leaders()[1:]]  # about the same: each counts as right
            predict.reveal(P, question, predict_view.reveal_gamma(best.gamma, best.speedup, tied, sweep.margin))
        _metrics(sweep, s)
    slider = _sliders(sweep) if s.level != "d1" else None
    _chart(sweep, s, slider)
    if sweep is not None and s.level != "d1":
        _table(sweep, s)
        _honesty(sweep, s)
        _positions(sweep, s)
    elif sweep is None and s.level == "d1":
        st.caption("Press **Measure** to race the helper at different numbers of guesses.")
    _lessons(s)
    _shape_section(pair, s)


run_page(main)
