"""What a visitor of a shared server may choose: allowed pairs, classroom limits, link clamping, safe messages.

Pure Python (no Streamlit): the operator's settings come in as plain mappings (environment,
the `[specviz]` table of `.streamlit/secrets.toml`) and the script's arguments, so every rule
here is tested without a server. The command line (`python -m specviz …`) never reads this:
it keeps every freedom (hub ids and folders); only the app's visitors are limited.
"""

from __future__ import annotations

import argparse
import binascii
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specviz.models.registry import split_ref
from specviz.core import drafters as drafter_registry
from specviz.app.settings import _first, looks_like_path_or_hub, parse_query
from specviz.core.limits import APP_MAX_NEW_RANGE
from specviz.settings import Settings

log = logging.getLogger("specviz.app")

ENV_ALLOWED = "SPECVIZ_ALLOWED_PAIRS"  # extra pairs visitors may pick, separated by ";" or new lines
ENV_DEFAULT = "SPECVIZ_DEFAULT_PAIR"  # the pair a visitor sees first (a named or allowed pair)
ENV_CLASSROOM = "SPECVIZ_CLASSROOM"  # "1": classroom mode
ENV_PAIR = "SPECVIZ_CLASSROOM_PAIR"  # classroom: the one pair pupils use
ENV_MAX_NEW = "SPECVIZ_CLASSROOM_MAX_NEW"  # classroom: the largest max-new-tokens
ENV_DRAFTERS = "SPECVIZ_CLASSROOM_DRAFTERS"  # classroom: drafters pupils may use, comma-separated
ENV_WAITING = "SPECVIZ_MAX_WAITING"  # waiting runs per browser
ENV_LIVE_BATCH = "SPECVIZ_CLASSROOM_LIVE_BATCH"  # classroom: "1" lets pupils start the batch lab's live measurement
ENV_CLASS_MEMORY = "SPECVIZ_CLASS_MEMORY"  # "1": remembering drafters also draft from every visitor's earlier runs
SECRETS_TABLE = "specviz"
WAITING_PER_BROWSER = 4  # two Play presses (each queues a run and its baseline): a class of 30 waits behind 120 at most
WAITING_RANGE = (1, 20)
XSRF_COOKIE = "_streamlit_xsrf"  # one per browser (every tab sends it); Streamlit sets it with XSRF protection on

PAIR_REFUSED = ("This server runs only the model pairs its operator chose: the model pair in the link was "
                "ignored (pairs from the hub or from folders are switched off here).")
PAIR_UNKNOWN = "The link names a model pair this server does not offer; using {default} instead."
PAIR_FIXED = "In this classroom everyone uses {title}: the model pair in the link was ignored."
DRAFTER_FIXED = "In this classroom the drafter is {title}: the drafter in the link was ignored."
MAX_NEW_CLAMPED = "In this classroom runs make at most {cap} new tokens: “Max new tokens” was lowered to {cap}."


@dataclass(frozen=True)
class Policy:
    """The operator's rules for visitors; frozen (one per script run, compared and hashed freely)."""

    named: tuple[str, ...]  # the registry's named pairs, always offered (tiny-random only when asked)
    allowed: tuple[str, ...] = ()  # extra pairs (hf:…) the operator allowed for everyone
    default_pair: str | None = None  # what a fresh visitor gets; None: the registry's default
    classroom: bool = False  # pupils see only what they may change
    pair: str | None = None  # classroom: the fixed pair (None: any offered pair)
    max_new_tokens: int = APP_MAX_NEW_RANGE[1]  # the largest max-new-tokens a visitor may ask for
    drafters: tuple[str, ...] = field(default_factory=drafter_registry.names)  # drafters visitors may use (default: every one)
    waiting_per_browser: int = WAITING_PER_BROWSER  # queued runs one browser may have at once
    live_batch: bool = False  # classroom: the batch lab may measure live (it holds the shared worker for minutes)
    # remembering drafters draft from every visitor's earlier runs, not only the visitor's own: faster for a class on
    # the same presets, but one pupil's text can then appear among another's drafted tokens (off unless the operator asks)
    class_memory: bool = False

    @property
    def batch_lab_live(self) -> bool:
        """Whether a visitor may start the batch lab's live measurement (else it shows the shipped recording)."""
        return not self.classroom or self.live_batch

    @property
    def pairs(self) -> tuple[str, ...]:
        """Every pair a visitor may pick, by widget or by link."""
        if self.classroom and self.pair is not None:
            return (self.pair,)
        return self.named + tuple(p for p in self.allowed if p not in self.named)

    def first_pair(self, fallback: str) -> str:
        """The pair a visitor starts with."""
        for name in (self.pair if self.classroom else None, self.default_pair, fallback):
            if name is not None and name in self.pairs:
                return name
        return self.pairs[0]

    @property
    def max_new_range(self) -> tuple[int, int]:
        return APP_MAX_NEW_RANGE[0], self.max_new_tokens


# ------------------------------------------------------------------------------------------
# Reading the operator's settings
# ------------------------------------------------------------------------------------------


def _split_pairs(raw: Any) -> list[str]:
    """Pair names from a string (";" or new lines: pair names hold commas) or a list of strings."""
    items = raw if isinstance(raw, (list, tuple)) else re.split(r"[;\n]", str(raw or ""))
    return [str(p).strip() for p in items if str(p).strip()]


def _split_words(raw: Any) -> list[str]:
    items = raw if isinstance(raw, (list, tuple)) else str(raw or "").split(",")
    return [str(w).strip().lower() for w in items if str(w).strip()]


def _flag(raw: Any) -> bool:
    return raw is True or str(raw).strip().lower() in ("1", "true", "yes", "on")


def _int_in(raw: Any, lo: int, hi: int, what: str, problems: list[str]) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        problems.append(f"{what}: {raw!r} is not a whole number (ignored)")
        return None
    if not lo <= value <= hi:
        problems.append(f"{what}: {value} is outside {lo}..{hi} (clamped)")
    return min(max(value, lo), hi)


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    """`streamlit run app.py -- --classroom --pair NAME --max-new N --drafters model,ngram --allow-pair P --class-memory`."""
    parser = argparse.ArgumentParser(prog="app.py", add_help=False)
    parser.add_argument("--classroom", action="store_true")
    parser.add_argument("--pair")
    parser.add_argument("--max-new", dest="max_new")
    parser.add_argument("--drafters")
    parser.add_argument("--allow-pair", dest="allow", action="append", default=[])
    parser.add_argument("--max-waiting", dest="max_waiting")
    parser.add_argument("--live-batch", dest="live_batch", action="store_true")
    parser.add_argument("--class-memory", dest="class_memory", action="store_true")
    known, _ = parser.parse_known_args(list(argv))
    return known


def load_policy(named: Sequence[str], env: Mapping[str, str], secrets: Mapping[str, Any],
                argv: Sequence[str] = ()) -> tuple[Policy, list[str]]:
    """The operator's policy from (in rising precedence) secrets, environment and the script's arguments.

    Returns the policy and a list of problems for the server log (a bad setting never stops the app:
    it is ignored or clamped, and the safe default stands).
    """
    problems: list[str] = []
    table = secrets.get(SECRETS_TABLE, {}) if isinstance(secrets, Mapping) else {}
    table = table if isinstance(table, Mapping) else {}
    room = table.get("classroom", {})
    room = room if isinstance(room, Mapping) else {"enabled": room}
    args = _arguments(argv)

    allowed = [*_split_pairs(table.get("allowed_pairs")), *_split_pairs(env.get(ENV_ALLOWED)), *args.allow]
    classroom = bool(args.classroom) or _flag(env.get(ENV_CLASSROOM, "")) or _flag(room.get("enabled", False))
    pair = args.pair or env.get(ENV_PAIR) or room.get("pair") or None
    max_new = _int_in(args.max_new or env.get(ENV_MAX_NEW) or room.get("max_new_tokens"), *APP_MAX_NEW_RANGE,
                      "classroom max new tokens", problems)
    drafters = _split_words(args.drafters or env.get(ENV_DRAFTERS) or room.get("drafters"))
    waiting = _int_in(args.max_waiting or env.get(ENV_WAITING) or table.get("max_waiting"), *WAITING_RANGE,
                      "waiting runs per browser", problems)
    default = env.get(ENV_DEFAULT) or table.get("default_pair") or None

    known = drafter_registry.names()
    bad = [d for d in drafters if d not in known]
    if bad:
        problems.append(f"unknown drafters {bad} ignored: choose from {', '.join(known)}")
    drafters = [d for d in known if d in drafters] or list(known)
    policy = Policy(named=tuple(named), allowed=tuple(dict.fromkeys(allowed)),
                    default_pair=str(default) if default else None, classroom=classroom,
                    pair=str(pair) if pair else None,
                    max_new_tokens=max_new if (classroom and max_new) else APP_MAX_NEW_RANGE[1],
                    drafters=tuple(drafters) if classroom else known,
                    waiting_per_browser=waiting or WAITING_PER_BROWSER,
                    live_batch=bool(args.live_batch) or _flag(env.get(ENV_LIVE_BATCH, "")) or _flag(room.get("live_batch", False)),
                    class_memory=(bool(args.class_memory) or _flag(env.get(ENV_CLASS_MEMORY, ""))
                                  or _flag(table.get("class_memory", False))))
    if policy.pair is not None and policy.pair not in policy.named + policy.allowed:
        problems.append(f"classroom pair {policy.pair!r} is neither a named nor an allowed pair: ignored")
        policy = replace(policy, pair=None)
    return policy, problems


# ------------------------------------------------------------------------------------------
# Applying it to what a visitor asked for
# ------------------------------------------------------------------------------------------


def pair_note(raw: str, policy: Policy, default: str, title: str) -> str:
    """The friendly line for a refused pair; it never repeats what the link said (it may be a server path)."""
    if policy.classroom and policy.pair is not None:
        return PAIR_FIXED.format(title=title)
    if looks_like_path_or_hub(raw):
        return PAIR_REFUSED
    return PAIR_UNKNOWN.format(default=title or default)


def enforce(settings: Settings, policy: Policy, fallback_pair: str,
            titles: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """The settings a visitor may have: an offered pair, an allowed drafter, max-new-tokens within the cap.

    Applied to every run's settings, not only to links: a widget's value is checked here again
    on the server, whatever the browser sent.
    """
    notes: list[str] = []
    titles = titles or {}
    changes: dict[str, Any] = {}
    base, precision = split_ref(settings.pair)  # "qwen-coder@bf16": an offered pair at a chosen target precision
    if base not in policy.pairs:
        first = policy.first_pair(fallback_pair)
        notes.append(pair_note(settings.pair, policy, first, titles.get(first, first)))
        changes["pair"] = first
    elif precision is not None and policy.classroom:  # pupils switching precision would make the server reload
        changes["pair"] = base
    if settings.drafter not in policy.drafters:
        changes["drafter"] = policy.drafters[0]
        notes.append(DRAFTER_FIXED.format(title=titles.get(policy.drafters[0], policy.drafters[0])))
    lo, hi = policy.max_new_range
    if not lo <= settings.max_new_tokens <= hi:
        changes["max_new_tokens"] = min(max(settings.max_new_tokens, lo), hi)
        if settings.max_new_tokens > hi and policy.classroom:
            notes.append(MAX_NEW_CLAMPED.format(cap=hi))
    return (replace(settings, **changes) if changes else settings), notes


# ------------------------------------------------------------------------------------------
# Who is asking (fair use) and what they may read (no internals)
# ------------------------------------------------------------------------------------------


def browser_id(cookie: str | None) -> str | None:
    """A stable id of one browser from Streamlit's XSRF cookie (every tab of it sends the same token).

    The cookie is "2|mask|masked_token|time" and gets a fresh mask on every page load, so the
    token is unmasked before hashing; the hash keeps the token itself out of the job records.
    """
    if not cookie:
        return None
    value = cookie.strip("\"'")
    try:
        if value.startswith("2|"):
            _, mask_hex, masked_hex, _ = value.split("|")
            mask, masked = binascii.a2b_hex(mask_hex), binascii.a2b_hex(masked_hex)
            if not mask or not masked:
                return None
            token = bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked))
        else:
            token = binascii.a2b_hex(value)
    except (ValueError, binascii.Error):
        return None
    return hashlib.sha256(token).hexdigest()[:16] if token else None


GENERIC_FAILURE = "Something went wrong on the server while doing this; the details are in the server log."
OUT_OF_MEMORY = "The server ran out of memory for this; try a smaller model pair or fewer tokens."
_PATHISH = re.compile(r"(^|[\s'\"`(=:])(/|~|\.\.|[A-Za-z]:\\)|\\\\|https?://|\w+\.(py|json|safetensors|bin|gguf|toml)\b")
_INTERNALS = re.compile(
    r"Traceback|File \"|\b[A-Z]\w*(Error|Exception)\b|\b(torch|transformers|huggingface|hf_hub|safetensors|"
    r"streamlit|tokenizers|numpy|pandas|python|pickle|errno|site-packages)\b", re.IGNORECASE)
MAX_MESSAGE = 240


def is_safe_line(text: str) -> bool:
    """True for one short line that names no file, path, library, exception type or traceback."""
    return (bool(text.strip()) and "\n" not in text.strip() and len(text) <= MAX_MESSAGE
            and not _PATHISH.search(text) and not _INTERNALS.search(text))


def visitor_message(exc: BaseException, safe_types: tuple[type[BaseException], ...] = ()) -> str:
    """One friendly line for a visitor; the full error, traceback included, goes to the server log.

    Only messages of `safe_types` (the project's own one-line errors) are passed through, and
    even those only when they carry no path or internals; everything else becomes a plain line.
    """
    log.error("visitor-facing failure", exc_info=exc)
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return OUT_OF_MEMORY
    text = str(exc).strip()
    if isinstance(exc, safe_types) and is_safe_line(text):
        return text[:1].upper() + text[1:]
    return GENERIC_FAILURE


def settings_from_link(params: Mapping[str, Any], policy: Policy, fallback_pair: str,
                       titles: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """A visitor's settings from a link: parsed and clamped (settings.parse_query), then held to the policy.

    The pair is judged here, not in parse_query, so a refused pair gets the note that fits (hub
    or folder, unknown name, classroom) and no note ever repeats the link's pair text.
    """
    raw = {str(k): v for k, v in params.items()}
    asked = raw.pop("pair", None)
    settings, notes = parse_query(raw, policy.pairs)
    settings = replace(settings, pair=policy.first_pair(fallback_pair))
    if asked is not None:
        text = _first(asked).strip()
        if text in policy.pairs:
            settings = replace(settings, pair=text)
        else:
            notes.append(pair_note(text, policy, settings.pair, (titles or {}).get(settings.pair, settings.pair)))
    settings, more = enforce(settings, policy, fallback_pair, titles)
    return settings, notes + more
