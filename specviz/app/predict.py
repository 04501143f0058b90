"""Predict-then-reveal widgets: ask before a run, keep the pupil's choice, answer from the run's measurement."""

from __future__ import annotations

import streamlit as st

from specviz.viz.predict import Question, Reveal, verdict_html

ss = st.session_state


def _keep(widget_key: str, choice_key: str) -> None:
    ss[choice_key] = ss.get(widget_key)  # a plain key survives the run that no longer draws the radio


def choice(page: str, q: Question) -> str | None:
    """The pupil's recorded prediction for a question (None when none was made)."""
    return ss.get(f"{page}predict.{q.key}.choice")


def ask(page: str, q: Question, note: str = "Answer before you run it; the measurement answers it.") -> str | None:
    """The question as a radio (no default) in a bordered box; returns the recorded choice."""
    widget, kept = f"{page}predict.{q.key}", f"{page}predict.{q.key}.choice"
    if kept in ss and widget not in ss and ss[kept] in q.choices:
        ss[widget] = ss[kept]  # redrawn after a reveal was hidden again: keep the old choice on screen
    with st.container(border=True):
        st.markdown(f"**Predict:** {q.text}")
        st.radio("Your prediction", q.choices, key=widget, index=None, horizontal=True,
                 label_visibility="collapsed", on_change=_keep, args=(widget, kept))
        st.caption(note)
    return ss.get(kept)


def reveal(page: str, q: Question, answer: Reveal) -> None:
    """The answer box, judged against the choice the pupil recorded."""
    st.html(verdict_html(choice(page, q), answer, q.text))
