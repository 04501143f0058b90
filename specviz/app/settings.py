"""The app's view of the settings record (specviz.settings): its round trip through a URL query string, and the prompt box's guard."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import fields, replace
from typing import Any

from specviz.core import drafters
from specviz.core.limits import APP_MAX_NEW_RANGE, GAMMA_RANGE, MODES, SEED_RANGE, TEMPERATURE_RANGE, TOP_P_RANGE
from specviz.lessons import LEVELS
from specviz.settings import DEFAULTS, MAX_PROMPT_CHARS, Settings

LEVEL_TITLES: dict[str, str] = {"d1": "D1 · Story", "d2": "D2 · Picture", "d5": "D5 · Frontier"}
QUERY_KEYS: dict[str, str] = {  # query-string name -> Settings field
    "level": "level", "pair": "pair", "drafter": "drafter", "mode": "mode", "temp": "temperature",
    "top_p": "top_p", "seed": "seed", "gamma": "gamma", "adaptive": "adaptive",
    "max_new": "max_new_tokens", "present": "presenter",
}


SHOWN_CHARS = 40  # a link's value is echoed in a note at most this long


def looks_like_path_or_hub(raw: str) -> bool:
    """A value that points outside the registry: a hub id, a folder, a home or parent reference."""
    text = str(raw).strip()
    return text.lower().startswith("hf:") or any(ch in text for ch in "/\\~") or ".." in text


def shown(raw: str) -> str:
    """A link's value as a note may echo it: one line, short, and unable to leave its `code` span.

    Notes are Markdown: a backtick would end the code span and let a link smuggle in an image
    that calls another server, so backticks, control characters and line breaks become spaces.
    A value that looks like a path or a hub id is not echoed at all: it may name a place on the
    server, and the note stays on the page until the visitor changes a setting.
    """
    if looks_like_path_or_hub(raw):
        return "…"
    flat = "".join(" " if ch == "`" or not ch.isprintable() else ch for ch in str(raw))
    return flat if len(flat) <= SHOWN_CHARS else flat[: SHOWN_CHARS - 1] + "…"


def _first(value: Any) -> str:
    """Query values may come as a list (repeated keys): use the last one, as Streamlit does."""
    if isinstance(value, (list, tuple)):
        return str(value[-1]) if value else ""
    return str(value)


def _clamp_number(name: str, raw: str, cast: type, lo: float, hi: float, notes: list[str]) -> Any:
    try:
        value = float(raw) if cast is int else cast(raw)  # clamped before int(): int(inf) would raise
    except (TypeError, ValueError):
        notes.append(f"Ignored `{name}={shown(raw)}` in the link: not a number.")
        return None
    if value != value:  # NaN
        notes.append(f"Ignored `{name}={shown(raw)}` in the link: not a number.")
        return None
    if value < lo or value > hi:
        clamped = cast(min(max(value, lo), hi))
        notes.append(f"`{name}={shown(raw)}` in the link is outside {lo}–{hi}; using {clamped}.")
        return clamped
    return cast(value)


def _choice(name: str, raw: str, allowed: Sequence[str], notes: list[str]) -> str | None:
    value = raw.strip().lower()
    if value in allowed:
        return value
    notes.append(f"Ignored `{name}={shown(raw)}` in the link: choose one of {', '.join(allowed)}.")
    return None


def _flag(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def parse_query(params: Mapping[str, Any], pair_names: Sequence[str]) -> tuple[Settings, list[str]]:
    """Settings from a query string; bad values are clamped or ignored, each with a friendly note."""
    notes: list[str] = []
    found: dict[str, Any] = {}
    get = {k: _first(v) for k, v in params.items()}
    if "level" in get:
        found["level"] = _choice("level", get["level"], LEVELS, notes)
    if "pair" in get:
        found["pair"] = get["pair"].strip() if get["pair"].strip() in pair_names else None
        if found["pair"] is None:
            notes.append("The link names a model pair this server does not offer; using the default pair.")  # never echoed: it may be a path
    if "drafter" in get:
        found["drafter"] = _choice("drafter", get["drafter"], drafters.names(), notes)
    if "mode" in get:
        found["mode"] = _choice("mode", get["mode"], MODES, notes)
    if "temp" in get:
        found["temperature"] = _clamp_number("temp", get["temp"], float, *TEMPERATURE_RANGE, notes)
    if "top_p" in get:
        found["top_p"] = _clamp_number("top_p", get["top_p"], float, *TOP_P_RANGE, notes)
    if "seed" in get:
        found["seed"] = _clamp_number("seed", get["seed"], int, *SEED_RANGE, notes)
    if "gamma" in get:
        found["gamma"] = _clamp_number("gamma", get["gamma"], int, *GAMMA_RANGE, notes)
    if "max_new" in get:
        found["max_new_tokens"] = _clamp_number("max_new", get["max_new"], int, *APP_MAX_NEW_RANGE, notes)
    if "present" in get:
        found["presenter"] = _flag(get["present"])
    if "adaptive" in get:
        found["adaptive"] = _flag(get["adaptive"])
    default_pair = DEFAULTS.pair if DEFAULTS.pair in pair_names else (pair_names[0] if pair_names else DEFAULTS.pair)
    base = replace(DEFAULTS, pair=default_pair)
    return replace(base, **{k: v for k, v in found.items() if v is not None}), notes


def to_query(settings: Settings) -> dict[str, str]:
    """The query-string entries that differ from the defaults (short, shareable links)."""
    out: dict[str, str] = {}
    by_field = {f: q for q, f in QUERY_KEYS.items()}
    for f in fields(Settings):
        value = getattr(settings, f.name)
        if value == getattr(DEFAULTS, f.name):
            continue
        if f.name in ("temperature", "top_p", "seed") and settings.mode == "greedy":
            continue  # sampling knobs mean nothing in greedy mode: keep them out of the link
        out[by_field[f.name]] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def cut_long_prompt(state: MutableMapping[str, Any], key: str, limit: int = MAX_PROMPT_CHARS) -> None:
    """A prompt box's on_change: keep the first `limit` characters of a longer paste and leave a note at key + ".note".

    The box has no max_chars of its own, because Streamlit's front end drops a paste over that limit
    without a word, and the pupil then meets an empty box.
    """
    text = state.get(key) or ""
    if len(text) > limit:
        state[key] = text[:limit]
        state[key + ".note"] = (f"The pasted text had {len(text):,} characters; the box keeps the first {limit:,} "
                                f"and cut the last {len(text) - limit:,}.")
