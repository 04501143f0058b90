"""A page's prompt on its way to a job: preset buttons, repairs a tokenizer needs, its ids, and whether it fits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import streamlit as st

from specviz import models
from specviz.settings import clean_prompt, encode_prompt, prompt_problem
from specviz.presets import GROUP_TITLES, presets_in


@dataclass(frozen=True)
class Prompt:
    """A prompt encoded by the pair's tokenizer: what every job starts from."""

    text: str
    ids: tuple[int, ...]  # the tokenizer's ids; () for a blank prompt (nothing to encode)
    context_length: int  # tokens the pair can read: prompt and new tokens together

    def problem(self, max_new_tokens: int) -> str | None:
        """A friendly sentence when this prompt cannot run with `max_new_tokens` more tokens, else None."""
        return prompt_problem(self.text, len(self.ids), self.context_length, max_new_tokens)


def encode(pair: models.LoadedPair, text: str) -> Prompt:
    """The prompt as the pair's tokenizer reads it (once per page run, for every job of the page)."""
    ids = tuple(encode_prompt(pair.tokenizer, text))
    return Prompt(text, ids, pair.context_length)


def repaired_prompt(text: str) -> str:
    """The prompt a tokenizer can take (settings.clean_prompt), with a caption for each repair."""
    text, changes = clean_prompt(text)
    for change in changes:
        st.caption(f":material/healing: {change}")
    return text


def preset_buttons(prefix: str, on_click: Callable[[str], None], hints: Mapping[str, str] | None = None) -> None:
    """The preset prompts as buttons in a Predictable and a Creative column; a press calls on_click(preset id)."""
    cols = st.columns(2, gap="medium")
    for col, group in zip(cols, ("predictable", "creative")):
        with col:
            st.markdown(f"**{GROUP_TITLES[group]}**{(hints or {}).get(group, '')}")
            with st.container(horizontal=True, gap="small"):
                for p in presets_in(group):
                    st.button(p.title, key=f"{prefix}preset.{p.id}", on_click=on_click, args=(p.id,), help=p.why)
