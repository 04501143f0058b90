"""The shared sidebar: its widgets hold the Settings, and the URL holds them too (a link replays a demo)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import streamlit as st

from specviz import models
from specviz.app.pairs import pair_store, pair_title
from specviz.app.settings import (
    DRAFTERS, GAMMA_RANGE, LEVEL_TITLES, LEVELS, MAX_NEW_RANGE, MODES, QUERY_KEYS, SEED_RANGE, TEMPERATURE_RANGE,
    TOP_P_RANGE, Settings, parse_query, to_query,
)

K = "cfg."  # session_state prefix of the sidebar's widgets
TEST_PAIR = "tiny-random"
DRAFTER_TITLES = {"model": "small draft model", "ngram": "prompt lookup (n-gram, no second model)"}
MODE_TITLES = {"greedy": "greedy", "sample": "sampling"}


def _pair_ok(name: str) -> bool:
    try:
        models.get_spec(name)
    except models.PairError:
        return False
    return True


def _known_pairs(params: Mapping[str, Any]) -> list[str]:
    wanted = str(params.get("pair", ""))
    names = list(models.PAIR_NAMES)
    if wanted.startswith("hf:") and _pair_ok(wanted):
        names.append(wanted)
    return names


def _init_from_query() -> None:
    """On a session's first run, read the URL into the widgets (bad values become friendly notes)."""
    if K + "ready" in st.session_state:
        return
    params = st.query_params.to_dict()
    settings, notes = parse_query(params, _known_pairs(params))
    for name in QUERY_KEYS.values():
        st.session_state[K + name] = getattr(settings, name)
    st.session_state[K + "notes"] = notes
    st.session_state[K + "ready"] = True


def visible_pairs(current: str) -> list[str]:
    """The sidebar's pair choices: the test pair only when asked for (URL or SPECVIZ_SHOW_TEST_PAIR=1)."""
    show_test = os.environ.get("SPECVIZ_SHOW_TEST_PAIR") == "1" or current == TEST_PAIR
    names = [n for n in models.PAIR_NAMES if n != TEST_PAIR or show_test]
    if current not in names:
        names.append(current)
    return names


def _pair_caption(name: str) -> str:
    try:
        spec = models.get_spec(name)
    except models.PairError as exc:
        return str(exc)
    view = pair_store().peek(name)
    state = "loaded ✓" if view and view.status == "ready" else f"Load cost: {spec.load_cost}"
    return f"{spec.description}  \n**{state}**"


def sidebar_settings() -> Settings:
    """Draw the shared sidebar and return the settings it holds (also kept for pages in session_state)."""
    _init_from_query()
    sb = st.sidebar
    for note in st.session_state.pop(K + "notes", []):
        sb.warning(note, icon=":material/link:")
    sb.radio("Explanation level", LEVELS, key=K + "level", format_func=LEVEL_TITLES.get, horizontal=True,
             help="Changes the words and how much is shown, never the run itself.")
    pair = st.session_state.get(K + "pair", models.DEFAULT_PAIR)
    sb.selectbox("Model pair (draft → target)", visible_pairs(pair), key=K + "pair", format_func=pair_title)
    sb.caption(_pair_caption(st.session_state[K + "pair"]))
    sb.radio("Drafter", DRAFTERS, key=K + "drafter", format_func=DRAFTER_TITLES.get, horizontal=False,
             help="Who guesses: the pair's small model, or a lookup that copies what followed the same words earlier.")
    sb.radio("Decoding", MODES, key=K + "mode", format_func=MODE_TITLES.get, horizontal=True,
             help="Greedy always takes the most likely token; sampling draws from the probabilities.")
    if st.session_state[K + "mode"] == "sample":
        sb.slider("Temperature", *TEMPERATURE_RANGE, step=0.05, key=K + "temperature", persist_state="session")
        sb.slider("Top-p", *TOP_P_RANGE, step=0.05, key=K + "top_p", persist_state="session")
        sb.number_input("Seed", *SEED_RANGE, step=1, key=K + "seed", persist_state="session",
                        help="Same seed, same dice: a sampled run replays exactly.")
    adaptive = sb.toggle("Adaptive γ", key=K + "adaptive",
                         help="Let the engine choose the draft length each round: long while the helper is sure "
                         "and right, nothing while drafting does not pay. γ below is then the most it may draft.")
    sb.slider("γ — most tokens guessed per round" if adaptive else "γ — draft length (tokens guessed per round)",
              *GAMMA_RANGE, key=K + "gamma")
    sb.slider("Max new tokens", *MAX_NEW_RANGE, key=K + "max_new_tokens")
    sb.toggle("Presenter mode (large type)", key=K + "presenter")
    settings = _settings_from_state()
    st.session_state[K + "settings"] = settings
    _write_query(to_query(settings), QUERY_KEYS)
    return settings


def _settings_from_state() -> Settings:
    ss, d = st.session_state, Settings()
    return Settings(
        level=ss.get(K + "level", d.level), pair=ss.get(K + "pair", d.pair), drafter=ss.get(K + "drafter", d.drafter),
        mode=ss.get(K + "mode", d.mode), temperature=float(ss.get(K + "temperature", d.temperature)),
        top_p=float(ss.get(K + "top_p", d.top_p)), seed=int(ss.get(K + "seed", d.seed)),
        gamma=int(ss.get(K + "gamma", d.gamma)), adaptive=bool(ss.get(K + "adaptive", d.adaptive)),
        max_new_tokens=int(ss.get(K + "max_new_tokens", d.max_new_tokens)),
        presenter=bool(ss.get(K + "presenter", d.presenter)),
    )


def settings() -> Settings:
    """The settings the sidebar drew on this run (defaults before it ran)."""
    return st.session_state.get(K + "settings", Settings())


def _write_query(values: Mapping[str, str], owned: Mapping[str, Any]) -> None:
    """Make the URL hold exactly `values` for the keys this caller owns (others are left alone)."""
    qp = st.query_params
    for key in owned:
        if key in values:
            if qp.get(key) != values[key]:
                qp[key] = values[key]
        elif key in qp:
            del qp[key]


def write_page_query(values: Mapping[str, str], owned: tuple[str, ...]) -> None:
    """Pages keep their own entries (prompt, preset, …) in the URL too, so a link replays a demo."""
    _write_query(values, dict.fromkeys(owned))


def read_query(key: str) -> str | None:
    """One raw URL value (pages read theirs once, on the session's first run)."""
    value = st.query_params.get(key)
    return None if value is None else str(value)
