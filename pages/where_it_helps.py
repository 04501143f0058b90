"""Where it helps: speed-up and acceptance per workload, predictable against creative text."""

from __future__ import annotations

import logging
from pathlib import Path

import streamlit as st

from specviz import host
from specviz.app import jobs
from specviz.app.pairs import pair_or_message
from specviz.app import predict
from specviz.presets import GROUP_TITLES, PRESETS
from specviz.viz import export
from specviz.viz import predict as predict_view
from specviz.settings import Settings
from specviz.app.shell import chart, font_size, lesson_md, run_page, table
from specviz.app.sidebar import settings
from specviz.labs import helpers, ranking, where_it_helps
from specviz.labs.where_it_helps import BenchFile, BenchReadError, WorkloadResults
from specviz.viz import strip
from specviz.viz import helpers as helpers_view
from specviz.viz import where_it_helps as where_it_helps_view

P = "where_it_helps."  # session_state prefix of this page
SOURCES = {"run": "Run now on this machine", "bench": "Latest benchmark results"}
SLOT = jobs.Slot(P + "key", ("Running the workloads",), "Run the workloads", changed=(
    "The sidebar settings changed since this measurement. Press **{button}** to measure them; "
    "until then the previous measurement stays on screen."))
HELPERS_SLOT = jobs.Slot(P + "helpers_key", ("Comparing the helpers",), "Compare the helpers")
ss = st.session_state

log = logging.getLogger("specviz.app")


def _request_run() -> None:
    ss[P + "run_request"] = True


@st.cache_data(show_spinner=False, max_entries=8)
def _read_bench(path: str, mtime: float) -> BenchFile:
    """One bench file, re-read only when it changes (mtime is part of the key)."""
    return where_it_helps.read_bench(Path(path))


def _header(s: Settings) -> None:
    st.title("Where does the helper help?" if s.level == "d1" else "Where it helps")
    lesson_md(s.level, "where_intro")


def _source(s: Settings, bench_path: Path | None) -> str:
    """The source radio; its default follows the pair (and changes when the pair does)."""
    default, why = where_it_helps.default_source(s.pair, bench_path is not None)
    if ss.get(P + "source_pair") != s.pair:
        ss[P + "source"] = default
        ss[P + "source_pair"] = s.pair
    source = st.radio("Where the numbers come from", list(SOURCES), key=P + "source", format_func=SOURCES.get,
                      horizontal=True)
    st.caption(f"Default for this pair: **{SOURCES[default]}** — {why}")
    return source


def _run_now(s: Settings, requested: bool, predicted: bool) -> WorkloadResults | None:
    """Source 1: every preset, target alone and speculative, with the sidebar's settings."""
    longer = s.max_new_tokens > where_it_helps.SHORT_TOKENS and st.toggle(
        f"Full length: the sidebar's {s.max_new_tokens} new tokens per run", key=P + "full",
        help=f"The default stops each run at {where_it_helps.SHORT_TOKENS} new tokens to keep the press short; "
             f"full length takes about {s.max_new_tokens / where_it_helps.SHORT_TOKENS:.1f} times as "
             "long (the time grows with the tokens), with a progress bar.")
    cfg = where_it_helps.workloads_config(s, full=longer)
    st.caption(f"Plan: for each of the {len(cfg.presets)} kinds of writing, the big model alone and then with its "
               f"helper, up to {cfg.spec.max_new_tokens} words each, {cfg.repeats} times over — {cfg.runs} races, "
               "one after another."
               if s.level == "d1" else
               f"Plan: for each of the {len(cfg.presets)} preset prompts, the target alone and then "
               f"{where_it_helps.method_words(cfg.drafter, cfg.spec)}; every workload {cfg.repeats} times, taking "
               f"turns — {cfg.runs} runs in all, one after another. Change γ, the drafter or the decoding in the "
               "sidebar.")
    st.button("Run the workloads", key=P + "run", icon=":material/play_arrow:", type="primary", on_click=_request_run)
    key = ("where_it_helps", cfg)
    if requested:
        pair = pair_or_message(s.pair)
        if pair is None:
            return None
        jobs.start(SLOT, {key: lambda: where_it_helps.workload_steps(pair, cfg)})
    done = jobs.results(SLOT, (key,), adopt=predicted)  # another visitor's run only after this one's prediction
    if SLOT.shown() is None:
        st.caption("Nothing measured yet with these settings: press **Run the workloads**.")
    return done[0] if done else None


def _show_bench() -> None:
    ss[P + "bench_shown"] = True


def _bench(s: Settings, path: Path | None, predicted: bool) -> WorkloadResults | None:
    """Source 2: the newest `python -m specviz bench` CSV for this pair, once this visitor predicted or asked for it."""
    if path is None:
        st.info(f"No benchmark file for `{s.pair}` in `benchmarks/`. Make one with "
                f"`python -m specviz bench --pair {s.pair}` (add `--quick` for a shorter run), "
                "or choose **Run now on this machine**.", icon=":material/folder_off:")
        return None
    try:
        file = _read_bench(str(path), path.stat().st_mtime)
    except BenchReadError as exc:
        log.warning("bench file not shown", exc_info=exc)
        st.error(str(exc), icon=":material/error:")
        return None
    modes = file.modes(s.pair)
    if not modes:
        st.info(f"`{path.name}` holds no rows for `{s.pair}`.")
        return None
    left, right = st.columns([1, 3])
    mode = left.selectbox("Decoding", modes, key=P + "bench_mode",
                          index=modes.index(s.mode) if s.mode in modes else 0)
    methods = file.methods(s.pair, mode)
    default = where_it_helps.default_method(methods, s.drafter, s.gamma, s.adaptive)
    if ss.get(P + "bench_method") not in methods:
        ss[P + "bench_method"] = default
    method = right.selectbox("Method shown", methods, key=P + "bench_method", format_func=where_it_helps.bench_method_words)
    _provenance(file, s)
    if not (predicted or ss.get(P + "bench_shown")):  # the file is the answer: it waits for this visitor
        st.button("Show the recorded results", key=P + "bench_go", icon=":material/history:", type="primary",
                  on_click=_show_bench)
        return None
    return where_it_helps.bench_results(file, s.pair, method, mode)


def _provenance(file: BenchFile, s: Settings) -> None:
    lines = [f"File: `{file.path.parent.name}/{file.path.name}` (modified {file.modified})"]
    if file.date:
        lines.append(f"run on {file.date}")
    if file.machine:
        lines.append(f"machine: {file.machine}")
    if file.command:
        lines.append(f"command: `{file.command}`")
    if file.settings and s.level == "d5":
        lines.append(f"settings: {file.settings}")
    st.caption(" · ".join(lines))
    st.caption("The benchmark uses its own short prompts of the same kinds (see `specviz/bench/harness.py`), not exactly the "
               "preset texts, and counts prompt reading in ms/token; the **Run now** source uses the presets and "
               "counts decoding only.")


def _results(res: WorkloadResults, s: Settings) -> None:
    st.subheader("What was measured" if s.level != "d1" else "What we found")
    where = f"Measured now on this machine ({host.machine_words()})" if res.source == "run" else "From the file"
    st.caption(f"{where}." if s.level == "d1" else f"{where}: {res.method}.")  # D1: no γ or decoding words
    if not res.rows:
        st.info("No workload could be measured.")
    else:
        st.markdown(where_it_helps_view.headline(res, s.level))
        if noise := where_it_helps_view.noise_sentence(res, s.level):
            st.caption(noise)
        chart(where_it_helps_view.workload_bars(res.rows, s.level, font_size(s)), P + "bars")
        _summary(res, s)
        if s.level != "d1":
            _table(res, s)
    for note in res.skipped:
        st.caption(f"Skipped — {note}")
    shown = {r.workload for r in res.rows}
    if res.source == "bench" and len(shown) < 6:
        st.caption(f"This benchmark file covers {len(shown)} workloads ({', '.join(r.title for r in res.rows)}); "
                   "a full `python -m specviz bench` run covers all six.")


def _summary(res: WorkloadResults, s: Settings) -> None:
    """One sentence comparing the two groups' means, in the level's words."""
    sp = {g: res.group_mean(g, "speedup") for g in ("predictable", "creative")}
    ac = {g: res.group_mean(g, "acceptance") for g in ("predictable", "creative")}
    if sp["predictable"] is None or sp["creative"] is None:
        return
    if s.level == "d1":
        st.markdown(f"With easy-to-guess writing the helper made it **{strip.speed_words(sp['predictable'])}** "
                    f"({sp['predictable']:.1f} times as fast); with stories and poems "
                    f"**{strip.speed_words(sp['creative'])}** ({sp['creative']:.1f} times as fast).")
        return
    acc = ""
    if ac["predictable"] is not None and ac["creative"] is not None:
        acc = f" (acceptance {ac['predictable']:.0%} against {ac['creative']:.0%})"
    st.markdown(f"**{GROUP_TITLES['predictable']}** workloads averaged **{sp['predictable']:.2f}×**, "
                f"**{GROUP_TITLES['creative'].lower()}** ones **{sp['creative']:.2f}×**{acc}.")


def _table(res: WorkloadResults, s: Settings) -> None:
    table(where_it_helps_view.workload_table(res, s.level))  # st.dataframe escapes every cell
    if res.target_step_ms:
        st.caption(f"One target step took {res.target_step_ms:.0f} ms (median) on this machine during these runs.")
    st.download_button("Download the measurement (JSON)", export.record_json(res), icon=":material/download:",
                       file_name="specviz-where-it-helps.json", mime="application/json", key=P + "json")


def _request_helpers() -> None:
    ss[P + "helpers_request"] = True


def _helpers_section(s: Settings) -> None:
    """Which helper wins? The draft model's chain, prompt lookup and the head's chain and tree on three presets."""
    d1 = s.level == "d1"
    st.divider()
    st.subheader("Which helper wins?")
    lesson_md(s.level, "helpers")
    cfg = helpers.HelpersConfig(s.pair, s.sampling)
    titles = [helpers_view.helper_name(h, s.level) for h in cfg.helpers]
    code, story = helpers_view.preset_title("code"), helpers_view.preset_title("story")
    questions = {"code": predict_view.helper_question(code, titles), "story": predict_view.helper_question(story, titles)}
    key = ("where_it_helps.helpers", cfg)
    asking = st.container()  # the predictions go above the button; whether to ask is known once the job is read
    mode = "greedy" if cfg.sampling.greedy else f"sampling (T = {cfg.sampling.temperature:g})"
    st.caption(f"Plan: on the code, list and story prompts, the big model alone, then with each helper: {cfg.runs} "
               f"races of {cfg.max_new_tokens} words." if d1 else
               f"Plan: on the code, list and story presets, the target alone, then each helper (γ = {helpers.GAMMA}; "
               f"the tree its default size): {cfg.runs} runs of {cfg.max_new_tokens} tokens, {mode}.")
    st.button("Race the helpers" if d1 else "Compare the helpers", key=P + "helpers_go", icon=":material/sprint:",
              on_click=_request_helpers)
    if ss.pop(P + "helpers_request", False):
        pair = pair_or_message(s.pair, key=P + "helpers_retry")
        if pair is None:
            return
        for line in helpers.available(pair, cfg.helpers)[1]:
            st.info(f"Left out: {line}", icon=":material/info:")
        jobs.start(HELPERS_SLOT, {key: lambda: helpers.helpers_steps(pair, cfg)})
    predicted = all(predict.choice(P, q) is not None for q in questions.values())
    done = jobs.results(HELPERS_SLOT, (key,), adopt=predicted)  # another visitor's race only after these predictions
    result = done[0] if done else None
    if result is None:
        with asking:
            for q in questions.values():
                predict.ask(P, q)
        return
    for preset, q in questions.items():
        ranked = sorted((p for p in result.points if p.preset == preset and p.speedup is not None),
                        key=lambda p: -p.speedup)
        if ranked:
            second = ranked[1] if len(ranked) > 1 else None
            tied = result.leaders(preset)[1:]  # within the margin of the fastest: about the same, each one right
            predict.reveal(P, q, predict_view.reveal_helper(
                helpers_view.helper_name(ranked[0].helper, s.level), ranked[0].speedup,
                helpers_view.helper_name(second.helper, s.level) if second else None, second.speedup if second else None,
                [(helpers_view.helper_name(p.helper, s.level), p.speedup) for p in tied], ranking.MIN_MARGIN))
    st.markdown(helpers_view.verdict(result, s.level))
    chart(helpers_view.helpers_figure(result, s.level, font_size(s)), P + "helpers_chart")
    if not d1:
        table(helpers_view.helpers_table(result, s.level), key=P + "helpers_table")


def main() -> None:
    s = settings()
    _header(s)
    requested = ss.pop(P + "run_request", False)
    bench_path = where_it_helps.find_bench(s.pair)
    source = _source(s, bench_path)
    question = predict_view.workload_question([p.title for p in PRESETS])
    predicted = predict.choice(P, question) is not None
    res = _run_now(s, requested, predicted) if source == "run" else _bench(s, bench_path, predicted)
    scored = [r for r in res.rows if r.speedup is not None] if res is not None else []
    if not scored:
        predict.ask(P, question)
    st.divider()
    if res is not None:
        if scored:
            best, *tied = res.leaders()  # several: about the same, and a prediction of any of them is right
            predict.reveal(P, question, predict_view.reveal_workload(
                best.title, best.speedup, [(r.title, r.speedup) for r in tied], res.margin))
        _results(res, s)
    lesson_md(s.level, "where_why")
    if s.level == "d5":
        lesson_md("d5", "where_caveats")
    _helpers_section(s)


run_page(main)
