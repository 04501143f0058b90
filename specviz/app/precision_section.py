"""Why checking is cheap, "Two precisions, one lesson": the target at its file's 4-bit blocks and with 16-bit weights,
both pass-cost curves measured turn about on this machine (D1 a sentence, D2 the picture, D5 the numbers)."""

from __future__ import annotations

import json
from typing import Any

import streamlit as st

from specviz.app import jobs, predict
from specviz.app.pairs import pair_or_message
from specviz.app.shell import chart, font_size, lesson_md, table
from specviz.labs import precisions
from specviz.labs.why_cheap import PassCostConfig
from specviz.settings import Settings
from specviz.viz import precisions as view
from specviz.viz import predict as predict_view

KS = (1, 2, 4, 5, 8, 16)  # 5: a chain of four guesses is checked in one pass of five
REPEATS = 3  # both targets' passes over every size, turn about, three times: under a minute on 2 cores
ALPHA = 0.8  # the D5 slider's start: an α the helper reaches on predictable text (How far to guess measures it)


def config() -> PassCostConfig:
    return PassCostConfig(ks=KS, repeats=REPEATS)


def draw(page: str, s: Settings) -> None:
    """The section: a prediction, the button, then the level's sentence, picture or numbers."""
    d1 = s.level == "d1"
    st.subheader("Small numbers or big numbers?" if d1 else "Two precisions, one lesson")
    lesson_md(s.level, "cheap_precisions")
    button = "Time both" if d1 else "Measure both precisions"
    key = ("why_cheap.precisions", s.pair, config())
    slot = jobs.Slot(page + "precisions", ("Timing the 4-bit and the 16-bit target",), button, adopt=False,
                     gone="This measurement is no longer in memory. Press **{button}** to run it again.")
    asking = st.container()
    if st.button(button, key=page + "go_precisions", icon=":material/balance:", type="primary"):
        pair = pair_or_message(s.pair, key=page + "precisions_retry")
        if pair is not None:
            jobs.start(slot, {key: lambda: precisions.measure_two_precisions(pair, config())})
    done = jobs.results(slot, (key,), adopt=False)
    if not done:
        with asking:
            predict.ask(page, predict_view.PRECISION, "Answer, then press the button: the stopwatch answers it.")
        return
    _result(page, done[0], s)


def _result(page: str, two: Any, s: Settings) -> None:
    top = two.four.cost.ks[-1]
    predict.reveal(page, predict_view.PRECISION, predict_view.reveal_precision(
        view.cheaper_to_check(two, top), two.four.steps_at(top), two.sixteen.steps_at(top), top))
    st.markdown(view.words(two, s.level))
    if s.level != "d1":
        chart(view.figure(two, s.level, font_size(s)), page + "precisions_chart")
    if s.level == "d5":
        alpha = st.slider("α: the share of guesses the target keeps (How far to guess measures it for a prompt)",
                          0.05, 0.99, ALPHA, 0.01, key=page + "precisions_alpha")
        st.markdown(view.best_words(two, alpha))
        table(view.table(two, alpha))
    m = two.four.cost.machine
    st.caption(f"Both targets timed turn about on {m.name} ({m.threads} threads), {REPEATS} times each size (medians); "
               f"the 16-bit one is a copy of the same file's values, made for this measurement in "
               f"{two.copy_seconds:.0f} s and let go after it.")
    st.download_button("Download both curves (JSON)", json.dumps(precisions.to_dict(two), indent=1),
                       file_name="specviz-two-precisions.json", mime="application/json", icon=":material/download:",
                       key=page + "precisions_json")
