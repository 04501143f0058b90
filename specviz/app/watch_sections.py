"""The Watch page's sections below the live view, shown once a run is on screen: the race, the verdicts, the head's
table, the second time, the downloads and the lessons. Pages draw; these draw too, for pages/watch.py alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import streamlit as st

from specviz.app import watch_state as ws
from specviz.app.watch_state import P
from specviz.core import drafters
from specviz.settings import Settings
from specviz.app.shell import ASSETS, chart, font_size, lesson_md
from specviz.app.sidebar import current_policy
from specviz.bench import gpu
from specviz.labs import watch
from specviz.labs.watch import RunRef
from specviz.lessons import labels
from specviz.models import heads
from specviz.labs import how_far
from specviz.app import predict
from specviz.viz import export
from specviz.viz import predict as predict_view
from specviz.viz import watch as watch_view
from specviz.viz import playback as pb
from specviz.viz import strip

ss = st.session_state


def cached_chart(name: str, sig: tuple[Any, ...], build: Callable[[], Any]) -> None:
    """Draw a plotly figure, rebuilding it only when its inputs changed (keeps animation ticks cheap)."""
    cached = ss.get(P + "fig." + name)
    if cached is None or cached[0] != sig:
        cached = ss[P + "fig." + name] = (sig, build())
    if cached[1] is not None:
        chart(cached[1], P + name)


def race(ref: RunRef, s: Settings) -> None:
    """Plain vs speculative decoding, replayed on a shared clock at measured speed."""
    L = labels(s.level)
    spec, plain = ws.views(ref)
    st.subheader("The race" if s.level == "d1" else "Race: plain vs speculative (replayed at measured speed)")
    lesson_md(s.level, "race")
    if not (spec and plain and spec.generation and plain.generation):
        made = sum(len(r.new_ids) for r in plain.rounds) if plain else 0
        st.caption(f"The race starts once both runs are measured "
                   f"(plain run: {made}/{ref.settings.max_new_tokens} {L['tokens']}).")
        return
    spec_tl = pb.race_timeline(spec.rounds, len(spec.generation.tokens))
    plain_tl = pb.race_timeline(plain.rounds, len(plain.generation.tokens))
    end_ms = max(spec_tl.total_ms, plain_tl.total_ms)
    t0 = ss.get(P + "race_t0")
    racing = t0 is not None and (time.time() - t0) * 1000 < end_ms + 300
    speedup = watch.comparison(spec.generation, plain.generation).speedup  # type: ignore[union-attr]  # both done here
    if t0 is not None and not racing and speedup is not None:
        predict.reveal(P, predict_view.RACE, predict_view.reveal_race(speedup))
    elif t0 is None:
        predict.ask(P, predict_view.RACE, "Answer, then press **Start the race**: the race answers it.")
    st.button("Start the race", icon=":material/sports_score:", key=P + "race_go", on_click=ws.start_race, shortcut="G")

    @st.fragment(run_every=0.1 if racing else None)
    def race_view() -> None:
        start = ss.get(P + "race_t0")
        now_ms = 0.0 if start is None else min((time.time() - start) * 1000, end_ms)
        still = start is not None and now_ms < end_ms
        if racing and not still:
            st.rerun(scope="app")
        cols = st.columns(2, gap="medium")
        sides = ((cols[0], L["race_plain"], plain_tl, "sv-plain"), (cols[1], L["race_spec"], spec_tl, "sv-spec"))
        for col, title, tl, cls in sides:
            _, made = tl.at(now_ms)
            with col:
                st.html(strip.race_html(title, tl.text_at(now_ms), made, tl.tokens[-1] if tl.tokens else 0,
                                        now_ms >= tl.total_ms, cls))
        st.caption(watch.race_caption(start is not None, now_ms, s.level))
        if s.level != "d1":
            cached_chart("race", (ref.spec_key, s.level, s.presenter), lambda: watch_view.race_figure(spec_tl, plain_tl, L, font_size(s)))

    race_view()


def same_text(ref: RunRef, s: Settings) -> None:
    spec, plain = ws.views(ref)
    if not (spec and plain and spec.generation and plain.generation):
        return
    kind, line = watch.same_text_words(spec.generation, plain.generation, s.level)
    icons = {"success": ":material/check_circle:", "warning": None, "info": None}
    getattr(st, kind)(line, icon=icons[kind])


def drafter_verdict(ref: RunRef, s: Settings, device: str) -> None:
    """Say so, from this run's own α and c, when the draft model cannot pay here (a GPU, mostly)."""
    spec, plain = ws.views(ref)
    kind = drafters.spec(ref.settings.drafter)
    if s.level == "d1" or not (kind.needs_draft_model and kind.leviathan) or not (
            spec and plain and spec.generation and plain.generation):
        return
    trade = how_far.run_tradeoff(spec.generation, plain.generation)
    line = watch_view.cannot_pay_line(trade, device) if trade is not None else None
    if line:
        st.warning(line, icon=":material/speed:")


def head_section(ref: RunRef, s: Settings, pair: Any) -> None:
    """A run drafted by the trained head: what the helper is, and at D5 its figures beside the visitor's run before
    on the same prompt (the draft model's, when that is what ran), how it was trained, and the GPU case."""
    if not drafters.spec(ref.settings.drafter).needs_head:
        return
    st.subheader("The helper reads the big model's notes" if s.level == "d1" else "The helper: the big model's own notes")
    lesson_md(s.level, "head")
    if s.level != "d5":
        return
    rows = [("this run", ref.settings.drafter, watch.comparison(*_generations(ref)))]
    before = ws.before()
    if before is not None and before.prompt == ref.prompt and before.settings.drafter != ref.settings.drafter:
        rows.append(("your run before, same prompt", before.settings.drafter, watch.comparison(*_generations(before))))
    table = watch_view.helper_rows(rows)
    if table is not None:
        st.dataframe(table, hide_index=True, key=P + "head_table")
    if len(rows) == 1:
        st.caption("To see the small draft model beside it on this same prompt: choose it in the sidebar and press "
                   "**Play**, then come back to the head; or compare all helpers on the presets under *Where it helps*.")
    man = heads.manifest(pair.spec.name)
    if man is not None:
        st.caption(watch_view.head_recipe_line(man))
    st.caption(watch_view.head_gpu_line(*_gpu_estimates(rows, [ref] + ([before] if len(rows) > 1 else []), pair)))


def _gpu_estimates(rows: list, refs: list, pair: Any) -> tuple[Any, list]:
    """The shipped H200 costs and, for each finished run in the head's table, its rounds replayed at them (only for the
    pair whose shapes were measured there)."""
    costs = gpu.load_costs() if pair.spec.name == gpu.PAIR else None
    out = []
    for (label, drafter, _), r in zip(rows, refs):
        spec_gen = _generations(r)[0]
        x = gpu.expected_for(spec_gen, costs, drafter) if costs is not None and spec_gen is not None else None
        if x is not None:
            out.append((label, drafters.spec(drafter).title, x))
    return costs, out


def memory_note(s: Settings) -> None:
    """Before a remembering run: what it may draft from on this server (and, loudly, when that is the whole class)."""
    if not watch.remembers(s):
        return
    if current_policy().class_memory:
        st.info(watch.memory_words(True), icon=":material/groups:")
    else:
        st.caption(watch.memory_words(False))


def second_time(ref: RunRef, s: Settings) -> None:
    """A drafter that remembers: predict the second run, then compare it with the first (same settings, this visitor)."""
    if not watch.remembers(s):
        return
    st.subheader("The second time")
    lesson_md(s.level, "remember")
    before = ws.previous()
    now = watch.comparison(*_generations(ref))
    first = watch.comparison(*_generations(before)) if before is not None else None
    if now is not None and first is not None and now.speedup and first.speedup:
        predict.reveal(P, predict_view.SECOND, predict_view.reveal_second(
            first.speedup, now.speedup, first.tokens_per_target_call, now.tokens_per_target_call))
    else:
        predict.ask(P, predict_view.SECOND, "Answer, then press **Play** again once this run has ended: "
                    "the second run answers it.")


def _generations(ref: RunRef) -> tuple[Any, Any]:
    """A run's and its baseline's Generations (None for one not done, or gone from the runner)."""
    spec, plain = ws.views(ref)
    return (spec.generation if spec else None), (plain.generation if plain else None)


def downloads(ref: RunRef) -> None:
    spec, plain = ws.views(ref)
    if not (spec and spec.generation):
        return
    base = plain.generation if plain and plain.generation else None
    meta = {"pair": ref.spec_key[1], "prompt": ref.prompt, "drafter": ref.settings.drafter}
    with st.container(horizontal=True, gap="small"):
        st.download_button("Download trace (CSV)", export.trace_csv(spec.generation), "specviz-trace.csv", "text/csv",
                           key=P + "csv", icon=":material/download:", on_click="ignore")
        st.download_button("Download trace (JSON)", export.trace_json(spec.generation, base, meta), "specviz-trace.json",
                           "application/json", key=P + "json", icon=":material/download:", on_click="ignore")


def lessons(ref: RunRef | None, s: Settings) -> None:
    """The deeper notes of D2 and D5 (D1 keeps to the story)."""
    if s.level == "d1":
        lesson_md("d1", "where")
        return
    L = labels(s.level)
    spec, plain = ws.views(ref)
    st.subheader("Go deeper")
    if s.level == "d2":
        with st.expander("The four steps of a round", expanded=False):
            lesson_md("d2", "round")
        with st.expander("The memory picture: why checking several tokens is cheap"):
            lesson_md("d2", "memory")
            st.image(str(ASSETS / "memory.svg"), width=640)
            if spec and spec.rounds:
                chart(watch_view.verify_cost_figure(spec.rounds, plain.rounds if plain else (), L, font_size(s)),
                      P + "cost2")
        with st.expander("Exact, not approximate"):
            lesson_md("d2", "rule")
            lesson_md("d2", "analogy")
        lesson_md("d2", "where")
        return
    with st.expander("The acceptance rule and the residual", expanded=True):
        lesson_md("d5", "rule")
    with st.expander("Leviathan's trade-off", expanded=True):
        lesson_md("d5", "tradeoff")
        if spec and spec.generation and (no_curve := watch.no_curve_words(spec.generation.drafter)):
            st.caption(no_curve)
        elif spec and plain and spec.generation and plain.generation:
            trade = how_far.run_tradeoff(spec.generation, plain.generation)
            if trade is not None:
                chart(watch_view.tradeoff_figure(trade.textbook, trade.with_cost, trade.gamma, trade.measured,
                                                 L, font_size(s)), P + "tradeoff")
                st.caption(watch_view.tradeoff_sentence(trade.textbook, trade.with_cost, trade.verify_steps,
                                                        trade.gamma, trade.measured))
        else:
            st.caption("The curve for this run's α and c appears once both runs are measured.")
    with st.expander("What one target pass costs here (measured)"):
        lesson_md("d5", "cpu")
        if spec and spec.rounds:
            chart(watch_view.verify_cost_figure(spec.rounds, plain.rounds if plain else (), L, font_size(s)), P + "cost5")
    with st.expander("Beyond one draft model: batching, features, trees, memory"):
        # a remembering drafter's run shows the memory's text above, under "The second time"
        for key in ("batching", "eagle", "trees") + (() if watch.remembers(s) else ("remember",)):
            lesson_md("d5", key)
    lesson_md("d5", "where")
