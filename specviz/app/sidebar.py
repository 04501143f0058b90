"""The shared sidebar: its widgets hold the Settings, and the URL holds them too (a link replays a demo)."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import streamlit as st

from specviz import models
from specviz.core import drafters
from specviz.models import fit as model_fit
from specviz.app import policy as policy_rules
from specviz.app.pairs import pair_store, pair_title
from specviz.app.policy import Policy
from specviz.app.settings import LEVEL_TITLES, QUERY_KEYS, to_query
from specviz.core.limits import TARGET_PRECISIONS, GAMMA_RANGE, MODES, SEED_RANGE, TEMPERATURE_RANGE, TOP_P_RANGE
from specviz.lessons import LEVELS
from specviz.settings import Settings, bounded

log = logging.getLogger("specviz.app")

K = "cfg."  # session_state prefix of the sidebar's widgets
TEST_PAIR = "tiny-random"
MODE_TITLES = {"greedy": "greedy", "sample": "sampling"}


def _drafter_title(name: str) -> str:
    return drafters.spec(name).title


def current_policy() -> Policy:
    """The operator's rules (secrets, environment, `streamlit run app.py -- --classroom …`), read on every run.

    Cheap, and never cached: an operator's edit of secrets.toml applies on the next rerun.
    """
    found, problems = policy_rules.load_policy(models.PAIR_NAMES, os.environ, _secrets(), sys.argv[1:])
    for problem in problems:
        log.warning("policy: %s", problem)
    return found


def _secrets() -> Mapping[str, Any]:
    """`.streamlit/secrets.toml` as a dict ({} when there is none or it cannot be read)."""
    try:
        return st.secrets.to_dict() if st.secrets.load_if_toml_exists() else {}
    except Exception as exc:  # noqa: BLE001 - a broken secrets file must not take the app down
        log.warning("secrets.toml could not be read: %s", exc)
        return {}


def _pair_titles(rules: Policy) -> dict[str, str]:
    return {**{n: pair_title(n) for n in rules.pairs}, **{d.name: d.title for d in drafters.specs()}}


def _init_from_query() -> None:
    """On a session's first run, read the URL into the widgets (bad values become friendly notes).

    Only pairs the policy offers are taken from a link: a hub id or a folder is refused before
    anything is resolved, read or downloaded.
    """
    if K + "ready" in st.session_state:
        return
    rules = current_policy()
    params = st.query_params.to_dict()
    # a link's pair may carry a target precision ("qwen-coder@bf16"): the policy checks the pair, the precision box gets the rest
    precision = None
    if "pair" in params:  # no pair in the link: the operator's default, not the library's
        params["pair"], precision = models.split_ref(str(params["pair"]))
    settings, notes = policy_rules.settings_from_link(params, rules, start_pair().pair, _pair_titles(rules))
    for name in QUERY_KEYS.values():
        st.session_state[K + name] = getattr(settings, name)
    st.session_state[K + "precision"] = precision or AUTO
    st.session_state[K + "notes"] = notes
    st.session_state[K + "ready"] = True


def visible_pairs(current: str, rules: Policy | None = None) -> list[str]:
    """The sidebar's pair choices (the policy's pairs): the test pair only when asked for (URL or SPECVIZ_SHOW_TEST_PAIR=1)."""
    offered = (rules or current_policy()).pairs
    show_test = os.environ.get("SPECVIZ_SHOW_TEST_PAIR") == "1" or current == TEST_PAIR
    names = [n for n in offered if n != TEST_PAIR or show_test]
    if current not in names and current in offered:
        names.append(current)
    return names or list(offered)


def _pair_caption(name: str) -> str:
    try:
        spec = models.get_spec(name)
    except models.PairError as exc:
        return str(exc)
    view = pair_store().peek(name)
    ready = view is not None and view.status == "ready"
    if name not in models.PAIR_NAMES:  # an operator's hub or folder pair: its description would show where it lives
        return f"A model pair added by this server's operator.  \n**{'loaded ✓' if ready else 'not loaded yet'}**"
    if ready:  # what this server's load took, measured (a first start includes its cache's build)
        took = getattr(view.pair, "load_s", 0.0)
        return f"{spec.description}  \n**loaded ✓{f' in {took:.0f} s here' if took else ''}**"
    return f"{spec.description}  \n**Load cost: {spec.load_cost}**"


def sidebar_settings() -> Settings:
    """Draw the shared sidebar and return the settings it holds (also kept for pages in session_state)."""
    _init_from_query()
    rules = current_policy()
    _hold_to(rules)
    sb = st.sidebar
    notes_box = sb.container()  # filled once the settings are known: the link's notes stay until the visitor changes them
    sb.radio("Explanation level", LEVELS, key=K + "level", format_func=LEVEL_TITLES.get, horizontal=True, persist_state="session",
             help="Changes the words and how much is shown, never the run itself.")
    pair = st.session_state.get(K + "pair", start_pair().pair)
    if rules.classroom and len(rules.pairs) == 1:  # a classroom's pupils see what they may change, nothing else
        sb.markdown(f"**Model pair:** {pair_title(pair)}")
    else:
        sb.selectbox("Model pair (draft → target)", visible_pairs(pair, rules), key=K + "pair", format_func=pair_title,
                     persist_state="session")
        precision_select(sb, st.session_state[K + "pair"])
        sb.caption(_pair_caption(_pair_from_state()))
        if (start := start_pair()).note and pair == start.pair:
            sb.caption(start.note)
    if len(rules.drafters) > 1:
        sb.radio("Drafter", rules.drafters, key=K + "drafter", format_func=_drafter_title, horizontal=False, persist_state="session",
                 help="Who guesses:\n\n" + "\n\n".join(f"**{drafters.spec(d).title}**: {drafters.spec(d).words}"
                                                       for d in rules.drafters))
    sb.radio("Decoding", MODES, key=K + "mode", format_func=MODE_TITLES.get, horizontal=True, persist_state="session",
             help="Greedy always takes the most likely token; sampling draws from the probabilities.")
    if st.session_state[K + "mode"] == "sample":
        sb.slider("Temperature", *TEMPERATURE_RANGE, step=0.05, key=K + "temperature", persist_state="session")
        sb.slider("Top-p", *TOP_P_RANGE, step=0.05, key=K + "top_p", persist_state="session")
        sb.number_input("Seed", *SEED_RANGE, step=1, key=K + "seed", persist_state="session",
                        help="Same seed, same dice: a sampled run replays exactly.")
    adaptive = sb.toggle("Adaptive γ", key=K + "adaptive", persist_state="session",
                         help="Let the engine choose the draft length each round: long while the helper is sure "
                         "and right, nothing while drafting does not pay. γ below is then the most it may draft.")
    sb.slider("γ — most tokens guessed per round" if adaptive else "γ — draft length (tokens guessed per round)",
              *GAMMA_RANGE, key=K + "gamma", persist_state="session")
    sb.slider("Max new tokens", *rules.max_new_range, key=K + "max_new_tokens", persist_state="session")
    sb.toggle("Presenter mode (large type)", key=K + "presenter", persist_state="session")
    # checked again on the server, whatever the browser sent
    settings, changed = policy_rules.enforce(_settings_from_state(), rules, start_pair().pair)
    if changed:
        log.warning("settings held to the policy: %s", changed)
    st.session_state[K + "settings"] = settings
    _show_link_notes(notes_box, settings)
    _write_query(to_query(settings), QUERY_KEYS)
    return settings


def _show_link_notes(box: Any, settings: Settings) -> None:
    """The link's notes, on every run until the visitor changes a setting: a page that reruns itself (Play does)
    must not wipe them a moment after they appeared."""
    ss = st.session_state
    notes = ss.get(K + "notes", [])
    shown_for = ss.setdefault(K + "notes_for", settings)
    if not notes or shown_for != settings:
        ss.pop(K + "notes", None)
        return
    for note in notes:
        box.warning(note, icon=":material/link:")


@functools.lru_cache(maxsize=1)
def start_pair() -> model_fit.StartPair:
    """The pair a visitor starts on: the default where it fits this machine's memory, else the light pair (once per server)."""
    try:
        models.build_ahead(models.DEFAULT_PAIR)  # a first start: its files are joined while the kernel below compiles
        precision = models.choose_precisions(models.DEFAULT_PAIR).target  # a quick cached probe: the fp16w peak is half
    except models.PairError:
        precision = None
    return model_fit.start_pair(models.DEFAULT_PAIR, precision=precision)


def _hold_to(rules: Policy) -> None:
    """Keep the widgets' state inside the policy before they are drawn (an operator may tighten it while a session is open)."""
    ss = st.session_state
    if ss.get(K + "pair") not in rules.pairs:
        ss[K + "pair"] = rules.first_pair(start_pair().pair)
    if ss.get(K + "drafter") not in rules.drafters:
        ss[K + "drafter"] = rules.drafters[0]
    lo, hi = rules.max_new_range
    ss[K + "max_new_tokens"] = bounded(ss.get(K + "max_new_tokens"), lo, hi, min(Settings().max_new_tokens, hi))


AUTO = "auto"  # the precision box's "chosen at load" entry


def _pair_from_state() -> str:
    """The sidebar's pair with its target precision ("qwen-coder@bf16"; the plain name when automatic)."""
    ss = st.session_state
    precision = ss.get(K + "precision", AUTO)
    return models.pair_ref(ss.get(K + "pair", Settings().pair), None if precision == AUTO else precision)


def precision_select(sb: Any, pair: str) -> None:
    """The target precision box: each entry with its memory cost and whether it keeps the promise here."""
    try:
        auto = models.choose_precisions(pair)
    except models.PairError:
        return

    def title(p: str) -> str:
        target = auto.target if p == AUTO else p
        cost = models.memory_estimate(pair, target, auto.draft)
        label = f"automatic: {models.precision.describe(target)}" if p == AUTO else models.precision.describe(p)
        return label + (f" · ≈ {cost / 1e9:.1f} GB" if cost else "")

    sb.selectbox("Target precision", (AUTO, *TARGET_PRECISIONS), key=K + "precision", format_func=title, persist_state="session",
                 help="gguf runs the model on its file's own 4-, 5-, 6- and 8-bit blocks (named GGUF pairs): a third of "
                 "fp16w's memory and bytes a step, each token's row still computed the same way alone as in a verify "
                 "pass, so greedy output stays identical. "
                 "fp32 keeps speculative greedy output identical to the target alone, and so does fp16w: the "
                 "weights stored in half precision (half the memory), every sum still in fp32, each token's row "
                 "computed the same way in a verify pass as in a one-token step. bf16 and int8 halve or "
                 "quarter the memory (and are faster on CPUs with bf16 / int8 instructions), but a verify pass and "
                 "a one-token step then round differently, so where the target's two best tokens are nearly tied "
                 "the two runs can pick differently: not bit-exact here.")
    if st.session_state.get(K + "level") == "d5":
        sb.caption(f"Chosen here: {auto.reason}. {memory_line()}")


def memory_line() -> str:
    """This server's own memory use (resident set) and the loaded pairs' weights, for the D5 sidebar."""
    import psutil

    rss = psutil.Process().memory_info().rss
    held = pair_store().ready()
    weights = ", ".join(f"{getattr(p.spec, 'title', n)} {p.weight_bytes / 1e9:.1f} GB" for n, p in held.items())
    return f"Server memory now: {rss / 1e9:.1f} GB resident" + (f" (weights: {weights})." if weights else ".")


def _settings_from_state() -> Settings:
    ss, d = st.session_state, Settings()
    return Settings(
        level=ss.get(K + "level", d.level), pair=_pair_from_state(), drafter=ss.get(K + "drafter", d.drafter),
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
