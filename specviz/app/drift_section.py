"""The Same answer page's D5 section "Why our text never drifts": one row's bits alone and inside 5 and 16 rows, per
kernel on this machine, and, where llama.cpp is built, its own text with the prompt read in one batch and one by one."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import streamlit as st

from specviz.app import jobs, predict
from specviz.app.shell import lesson_md, table
from specviz.core.progress import Progress
from specviz.labs import row_bits
from specviz.viz import predict as predict_view
from specviz.viz import same_answer as view

LLAMA_TOKENS = 64  # enough for the code preset's parting (231 characters on a Zen 4), a few seconds a run


def draw(page: str, pair: Any, prompt_text: str, level: str) -> None:
    """The section (D5 only): a prediction, the row-bits button and table, then llama.cpp's case."""
    if level != "d5":
        return
    st.subheader("3 · Why our text never drifts")
    lesson_md(level, "same_drift")
    _row_bits(page, pair)
    _llama_case(page, pair, prompt_text)


def _slot(page: str, name: str, button: str) -> jobs.Slot:
    return jobs.Slot(page + name, (button,), button, adopt=False, group=True,
                     gone="This result is no longer in memory. Press **{button}** to run it again.")


def _row_bits(page: str, pair: Any) -> None:
    button = "Check one row's bits"
    key = ("same_answer.row_bits", pair.spec.name, pair.target_precision)
    asking = st.container()
    if st.button(button, key=page + "row_bits_go", icon=":material/grid_on:"):
        jobs.start(_slot(page, "row_bits", button), {key: lambda: row_bits.measure_row_bits(pair.target)})
    done = jobs.results(_slot(page, "row_bits", button), (key,), adopt=False)
    if not done:
        with asking:
            predict.ask(page, predict_view.ROW_BITS, "Answer, then press the button: this machine's kernels answer it.")
        return
    bits = done[0]
    predict.reveal(page, predict_view.ROW_BITS, predict_view.reveal_row_bits(view.row_bits_verdicts(bits)))
    st.caption(view.row_bits_caption(bits))
    table(view.row_bits_frame(bits))


def _llama_case(page: str, pair: Any, prompt_text: str) -> None:
    from specviz.bench import llama

    why = llama.why_no_peer(pair.spec.name)
    if why:
        st.caption(f"llama.cpp's own case is shown where its build is present; here: {why}.")
        return
    button = "Run llama.cpp both ways"
    key = ("same_answer.llama_batch", pair.spec.name, prompt_text, LLAMA_TOKENS)
    st.markdown("**llama.cpp's own case.** The same prompt on the same file, greedy, once read in one batch "
                "(`-ub 512`, its default) and once one token at a time (`-ub 1`).")
    if st.button(button, key=page + "llama_go", icon=":material/terminal:"):
        jobs.start(_slot(page, "llama", button), {key: lambda: _batch_case(pair.spec.name, prompt_text)})
    done = jobs.results(_slot(page, "llama", button), (key,), adopt=False)
    if done:
        st.markdown(view.batch_case_words(done[0]))


def _batch_case(pair_name: str, prompt_text: str) -> Generator[Progress, None, row_bits.BatchCase]:
    import torch

    from specviz.bench import llama

    with llama.peer_for(pair_name, torch.get_num_threads()) as peer:
        if peer is None:
            raise RuntimeError(llama.why_no_peer(pair_name) or "llama.cpp is not available")
        return (yield from row_bits.llama_batch_case(peer, prompt_text, LLAMA_TOKENS))
