"""Why checking is cheap: time one target pass over 1–16 new tokens, and what batching leaves of the speed-up."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import streamlit as st

from specviz import host
from specviz.bench.timing import NOISY_SPREAD
from specviz.core.limits import REPEATS_RANGE
from specviz.app import jobs, precision_section
from specviz.app.pairs import pair_or_message
from specviz.settings import bounded
from specviz.app import predict
from specviz.viz import predict as predict_view
from specviz.settings import Settings
from specviz.app.shell import ASSETS, chart, font_size, lesson_md, run_page, table
from specviz.app.sidebar import current_policy, settings
from specviz.labs import busy
from specviz.bench.batch import BatchReport, batch_steps
from specviz.labs.why_cheap import (
    GPU_FIGURES, KernelConfig, PassCostConfig, ProfileConfig, Reference, load_reference, measure_kernel_cost,
    measure_loaded_pass_cost, measure_round_profile, pass_cost_to_dict,
)
from specviz.viz import why_cheap as why_cheap_view

P = "why_cheap."  # session_state prefix of this page
GPU_COMMAND = ("python -m specviz why-cheap --pair qwen-coder --device cuda --json "
               "--note 'GPU name, date' > assets/verify_cost_gpu.json")
ss = st.session_state

log = logging.getLogger("specviz.app")


# ------------------------------------------------------------------------------------------
# Each section: a button and its repeats, one measurement keyed by plain values, shown to any session
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """What differs between the page's two measurements: names, words, and how many repeats by default."""

    name: str  # "pass" or "batch": the widgets' keys and the runner key's tag
    title: tuple[str, str]  # the subheader at D1, and at D2/D5
    lesson: str  # the lesson text under it
    button: tuple[str, str]  # the button's label at D1, and at D2/D5
    icon: str
    repeats_label: str
    repeats: int  # the repeats box's starting value
    repeats_help: str
    what: str  # the job, for its progress bar
    changes: str  # the settings that make a new measurement, for the "changed since" note


PASS = Section("pass", ("How long does checking take?", "One pass, more new tokens"), "cheap_pass",
               ("Time the big model", "Measure pass times"), ":material/timer:", "Repeats per point (median shown)", 5,
               "More repeats steady the figures; each repeat is one pass per size, so the time grows with the "
               "repeats (the progress bar counts the passes).", "Timing the target's passes", "The repeats or the pair")
KERNELS = Section("kernels", ("Two ways to do the sums", "Two kernels, one layer, side by side"), "cheap_kernels",
                  ("Time both ways", "Time both kernels"), ":material/compare_arrows:", "Repeats per point (median shown)",
                  5, "Each repeat runs one decoder layer's linears over 1–16 rows through each kernel.",
                  "Timing both kernels", "The repeats or the pair")


def _measurement(sec: Section, s: Settings, config: Callable[[int], Any], make: Callable[[Any, Any], Any],
                 note: str | None = None, adopt: bool = False) -> Any:
    """A section's title, lesson, button and repeats box, then its job: run on a press, its result once done.

    `adopt`: show another visitor's measurement of these settings unasked (only once this visitor predicted)."""
    st.subheader(sec.title[s.level != "d1"])
    lesson_md(s.level, sec.lesson)
    if note:
        st.caption(note)
    button = sec.button[s.level != "d1"]
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        pressed = st.button(button, key=f"{P}go_{sec.name}", icon=sec.icon, type="primary")
        repeats = st.number_input(sec.repeats_label, *REPEATS_RANGE, value=sec.repeats, step=1,
                                  key=f"{P}{sec.name}_repeats", width=220, help=sec.repeats_help)
    cfg = config(bounded(repeats, *REPEATS_RANGE, sec.repeats))  # the widget's range, held again here
    key = (f"why_cheap.{sec.name}", s.pair, cfg)
    slot = jobs.Slot(P + sec.name, (sec.what,), button, changed=(
        f"{sec.changes} changed since this measurement: press **{{button}}** to measure them; "
        "the previous figures stay until then."))
    if pressed:
        pair = pair_or_message(s.pair, key=P + "retry")
        if pair is not None:
            jobs.start(slot, {key: lambda: make(pair, cfg)})
    done = jobs.results(slot, (key,), adopt=adopt)
    return done[0] if done else None


def _chart(fig: Any, key: str) -> None:
    chart(fig, P + key)


# ------------------------------------------------------------------------------------------
# Section 1: one pass, more new tokens
# ------------------------------------------------------------------------------------------


def _pass_section(s: Settings, reference: Reference | None) -> None:
    cost = _measurement(PASS, s, lambda repeats: PassCostConfig(repeats=repeats),
                        lambda pair, cfg: measure_loaded_pass_cost(pair, s.pair, cfg),
                        adopt=predict.choice(P, predict_view.CHEAP) is not None)
    if cost is None or 16 not in cost.ks:
        predict.ask(P, predict_view.CHEAP, "Answer, then press the button: the stopwatch answers it.")
    if cost is None:
        return
    if 16 in cost.ks:
        predict.reveal(P, predict_view.CHEAP, predict_view.reveal_cheap(cost.ratios[cost.ks.index(16)], cost.step_ms))
    st.markdown(why_cheap_view.pass_words(cost, s.level))
    fs = font_size(s)
    if s.level == "d1":
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
        table(why_cheap_view.pass_table(cost))
    st.caption(why_cheap_view.machine_line(cost, s.level))
    st.download_button("Download the measurement (JSON)", json.dumps(pass_cost_to_dict(cost), indent=1),
                       file_name="specviz-pass-times.json", mime="application/json", icon=":material/download:",
                       key=P + "pass_json")


def _kernel_words(kc: Any, s: Settings) -> str:
    """The comparison in the level's words, from its own numbers."""
    med = [kc.median_ms(i) for i in range(len(kc.kernels))]
    top, one = kc.ks.index(kc.ks[-1]), kc.ks.index(1)
    lines = [f"**{name}**: one row {m[one]:.2f} ms, {kc.ks[-1]} rows {m[top]:.2f} ms "
             f"(**{kc.ratios(i)[top]:.2f}×** one row)" for i, (name, m) in enumerate(zip(kc.kernels, med))]
    words = ("One layer of the big model, the same numbers, done by two different pieces of code. " if s.level == "d2"
             else f"One decoder layer's seven matmuls ({kc.layer_mb:.0f} MB of fp16 weights, its real values), "
                  f"timed through each kernel; a pass runs {kc.layers} such layers. ")
    return words + "; ".join(lines) + "."


def _kernel_section(s: Settings) -> None:
    """D2/D5: the target's two fp16-weight kernels on one layer, 1..16 rows (today's rowgemm and fbgemm before it)."""
    if s.level == "d1":
        return
    kc = _measurement(KERNELS, s, lambda repeats: KernelConfig(repeats=repeats),
                      lambda pair, cfg: measure_kernel_cost(pair.target, cfg))
    if kc is None:
        return
    if len(kc.kernels) < 2:
        st.caption("Nothing to compare on this server: " + (
            f"only {kc.kernels[0]} runs the fp16-weight linears here." if kc.kernels else
            "this pair's target does not keep its weights in fp16 here (see its precision in the sidebar)."))
        return
    st.markdown(_kernel_words(kc, s))
    _chart(why_cheap_view.kernel_figure(kc, font_size(s)), "kernels")
    if s.level == "d5":
        table(why_cheap_view.kernel_table(kc))


def _profile_section(s: Settings) -> None:
    """D5: where each millisecond of a round goes, from one run with lap timers on."""
    if s.level != "d5":
        return
    st.subheader("Where a round's time goes")
    lesson_md("d5", "cheap_profile")
    button = "Profile a round"
    cfg = ProfileConfig(gamma=s.gamma)
    key = ("why_cheap.profile", s.pair, cfg)
    slot = jobs.Slot(P + "profile", ("Profiling one run",), button, changed=(
        "The pair or γ changed since this profile: press **{button}** to profile them; the previous figures stay "
        "until then."))
    if st.button(button, key=P + "go_profile", icon=":material/query_stats:", type="primary"):
        pair = pair_or_message(s.pair, key=P + "retry_profile")
        if pair is not None:
            jobs.start(slot, {key: lambda: measure_round_profile(pair, cfg)})
    done = jobs.results(slot, (key,), adopt=False)  # a visitor sees a profile after their own press
    if not done:
        return
    found = done[0]
    draft, verify, between = (found.role_ms(r) for r in ("draft", "verify", "round"))
    st.markdown(f"A round took **{found.round_ms:.0f} ms** on average over {found.rounds} rounds (γ = {cfg.gamma}, "
                f"model drafter, greedy): the draft's passes and sampling **{draft:.0f} ms**, the target's check "
                f"**{verify:.0f} ms**, the rest between them **{between:.1f} ms**.")
    _chart(why_cheap_view.profile_figure(found, font_size(s)), "profile")
    table(why_cheap_view.profile_table(found))


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


# ------------------------------------------------------------------------------------------
# Section 2: busy servers, measured (real batched runs; a shipped recording in a classroom)
# ------------------------------------------------------------------------------------------


BUSY_SHOWN = P + "busy.shown"  # "recording" or "live": which figures this session asked to see


def _recordings() -> tuple[BatchReport | None, BatchReport | None]:
    """The shipped recordings (short prompts, long context); a broken file is logged and left out, never fatal."""
    found = []
    for path in (busy.RECORDING, busy.LONG_RECORDING):
        try:
            found.append(busy.load_recording(path))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("batch recording %s ignored", path.name, exc_info=exc)
            found.append(None)
    return found[0], found[1]


def _busy_buttons(s: Settings, recording: BatchReport | None, live_ok: bool) -> BatchReport | None:
    """The prediction, then the two ways to the answer: the recorded run, or a live measurement on this server."""
    d1 = s.level == "d1"
    predict.ask(P, predict_view.BUSY, "Answer, then press a button: the measurement answers it.")
    with st.container(horizontal=True, vertical_alignment="bottom", gap="small"):
        if recording is not None and st.button("Show what happened" if d1 else "Show the recorded measurement",
                                               key=f"{P}busy_recorded", icon=":material/history:", type="primary"):
            ss[BUSY_SHOWN] = "recording"
        pressed = live_ok and st.button("Try it on this computer" if d1 else "Measure on this server",
                                        key=f"{P}busy_live", icon=":material/stacks:")
        repeats = st.number_input("Repeats per batch size", 1, 5, value=busy.LAB_REPEATS, step=1, key=f"{P}busy_repeats",
                                  width=200, help="Each repeat runs every batch size once more; the chart's whiskers "
                                  f"span the repeats. One repeat stops within {busy.time_limit(1):.0f} s (before a batch "
                                  "size that would end later, said under the chart); each repeat more allows "
                                  f"{busy.TIME_LIMIT_S:.0f} s more. This server: {host.machine_words()}."
                                  ) if live_ok and not d1 else busy.LAB_REPEATS
    if not live_ok:
        st.caption("In this classroom the recorded measurement is shown: a live one would hold the shared models "
                   "for minutes. The operator can allow it (`SPECVIZ_CLASSROOM_LIVE_BATCH=1`).")
    cfg = busy.lab_config(s, bounded(repeats, 1, 5, busy.LAB_REPEATS))
    key = ("why_cheap.busy", s.pair, cfg)
    slot = jobs.Slot(P + "busy", ("Running the batches",), "Try it on this computer" if d1 else "Measure on this server", changed=(
        "γ, the repeats or the pair changed since this measurement: press **{button}** to measure them; "
        "the previous figures stay until then."))
    if pressed:
        pair = pair_or_message(s.pair, key=P + "busy_retry")
        if pair is not None:
            jobs.start(slot, {key: lambda: batch_steps(pair, s.pair, cfg)})
            ss[BUSY_SHOWN] = "live"
    if ss.get(BUSY_SHOWN) == "live" and live_ok:
        done = jobs.results(slot, (key,))
        return done[0] if done else None
    return recording if ss.get(BUSY_SHOWN) == "recording" else None


def _busy_source(report: BatchReport, recorded: bool) -> str:
    when = "Measured just now on this server" if not recorded else \
        f"Recorded with the same code{' on ' + report.date if report.date else ''}"
    return (f"{when}: pair {report.pair}, {report.machine or 'this machine'}, greedy, γ = {report.gamma}, "
            f"{report.max_new_tokens} new tokens per run, the presets' prompts cycled."
            + (f" Command: `{busy.RECORD_COMMAND}`." if recorded else ""))


def _busy_section(s: Settings, reference: Reference | None) -> None:
    d1 = s.level == "d1"
    st.subheader("A whole class at once" if d1 else "Busy servers: batches, measured")
    lesson_md(s.level, "cheap_batch")
    recording, long = _recordings()
    live_ok = current_policy().batch_lab_live
    report = _busy_buttons(s, recording, live_ok)
    if report is None:
        return
    if not report.sizes:  # not even batch 1 fitted in the free memory
        st.warning(f"No batch size could be measured: {report.stopped}.", icon=":material/memory:")
        return
    last, first = report.sizes[-1], report.sizes[0]
    predict.reveal(P, predict_view.BUSY, predict_view.reveal_busy(last.batch, last.speedup, first.speedup))
    st.markdown(busy.busy_words(report, s.level))
    if line := busy.pattern_words(report, s.level):
        st.markdown(line)
    fs = font_size(s)
    if d1:
        _chart(why_cheap_view.busy_figure(report, None, fs, x_title="pupils sharing the big model",
                                          y_title="how much faster with the helper (×)", name="what the stopwatch said"),
               "busy_speedup")
    else:
        left, right = st.columns(2, gap="medium")
        with left:
            _chart(why_cheap_view.busy_figure(report, long if s.level == "d5" else None, fs), "busy_speedup")
        with right:
            _chart(why_cheap_view.busy_cost_figure(report, fs), "busy_cost")
    if report.stopped:
        st.caption(f":material/timer_off: {report.stopped}.")
    if not all(x.identical for x in report.sizes):
        st.error("Some batched runs differed from the same runs made alone: the executor broke its promise here. "
                 "Please report it with the JSON below.", icon=":material/error:")
    if not d1:
        rows = busy.table_rows(report)
        table(rows)
        with st.container(horizontal=True, gap="small"):
            st.download_button("CSV", busy.csv_text(rows), file_name="specviz-batches.csv", mime="text/csv",
                               icon=":material/download:", key=f"{P}busy_csv")
            st.download_button("JSON", json.dumps(report.as_dict(), ensure_ascii=False, indent=1),
                               file_name="specviz-batches.json", mime="application/json",
                               icon=":material/download:", key=f"{P}busy_json")
    st.caption(_busy_source(report, report is recording))
    if s.level == "d5":
        if long is not None:
            st.markdown(busy.long_words(long, report))
            st.caption(f"Long-context recording{' of ' + long.date if long.date else ''}: {long.machine}, a target of "
                       f"{long.weight_bytes / 1e9:.1f} GB of weights"
                       + ("" if long.weight_bytes == report.weight_bytes else
                          f" (the batches above: {report.weight_bytes / 1e9:.1f} GB)")
                       + f"; command: `{busy.LONG_COMMAND}`.")
        if words := busy.gpu_words(reference):
            st.markdown(words)


# ------------------------------------------------------------------------------------------
# Section 3: this CPU and a GPU
# ------------------------------------------------------------------------------------------


def _hardware_section(s: Settings, reference: Reference | None) -> None:
    st.subheader("This computer" if s.level == "d1" else "What this CPU shows, and what a GPU would show")
    lesson_md(s.level, "cheap_hardware")
    if s.level == "d1":
        return
    if reference is None:
        st.info("**No GPU figures measured yet.** None was lent to this project so far; the numbers above are "
                "this CPU's only. The same code measures a GPU in one command:", icon=":material/developer_board:")
        st.code(GPU_COMMAND, language="bash", wrap_lines=True)  # never cut at 390 px
        st.caption(f"Saved as `{GPU_FIGURES.name}` in `assets/`, the GPU curves appear in the charts above next to "
                   "this machine's.")
        return
    machine = reference.pass_cost.machine if reference.pass_cost is not None else None
    st.markdown(f"#### A second machine: {machine.name if machine else 'a GPU'}")
    st.success(f"Measured with the same code on {machine.name if machine else 'a GPU'} "
               f"({reference.note or 'no note'}); drawn in orange in the charts above.",
               icon=":material/developer_board:")
    if reference.pass_cost is not None:
        st.markdown(why_cheap_view.gpu_sentence(reference, s.gamma))
        table(why_cheap_view.pass_table(reference.pass_cost))
    if reference.step_cost is not None and s.level == "d5":
        table(why_cheap_view.step_cost_table(reference.step_cost))
    st.caption("Measure another GPU with the same code:")
    st.code(GPU_COMMAND, language="bash", wrap_lines=True)  # never cut at 390 px


# ------------------------------------------------------------------------------------------
# The page
# ------------------------------------------------------------------------------------------


def main() -> None:
    s = settings()
    st.title("Why checking is cheap" if s.level != "d1" else "Why checking is quick")
    lesson_md(s.level, "cheap_intro")
    if s.level == "d2":
        st.image(str(ASSETS / "memory.svg"), width=640)
    try:
        reference = load_reference()
    except (ValueError, KeyError, TypeError) as exc:  # a hand-edited figures file must not break the page
        log.warning("GPU figures ignored", exc_info=exc)
        st.warning(f"Ignored `{GPU_FIGURES.name}`: it is not a measurement file.")
        reference = None
    _pass_section(s, reference)
    precision_section.draw(P, s)
    _kernel_section(s)
    _profile_section(s)
    st.divider()
    _busy_section(s, reference)
    st.divider()
    _hardware_section(s, reference)


run_page(main)
