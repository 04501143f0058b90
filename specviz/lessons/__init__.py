"""The D1/D2/D5 lesson texts and interface wording, stored as data (Markdown files and labels.toml)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Literal

LESSON_DIR = Path(__file__).parent
Level = Literal["d1", "d2", "d5"]
LEVELS: tuple[Level, ...] = ("d1", "d2", "d5")  # explanation depth: children, curious beginners, experts


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise KeyError(f"unknown level {level!r}: use one of {', '.join(LEVELS)}")


@lru_cache(maxsize=128)
def lesson(level: str, key: str) -> str:
    """The Markdown text `<level>/<key>.md` (KeyError if that level has no such text)."""
    _check_level(level)
    path = LESSON_DIR / level / f"{key}.md"
    if not path.is_file():
        raise KeyError(f"no lesson text {level}/{key}.md")
    return path.read_text(encoding="utf-8").strip()


def has_lesson(level: str, key: str) -> bool:
    """Whether a level has a text for `key` (levels show different amounts)."""
    return level in LEVELS and (LESSON_DIR / level / f"{key}.md").is_file()


@lru_cache(maxsize=8)
def labels(level: str) -> Mapping[str, str]:
    """The wording of every interface label at a level: [common] overlaid with [<level>]."""
    _check_level(level)
    data = tomllib.loads((LESSON_DIR / "labels.toml").read_text(encoding="utf-8"))
    merged = {**data.get("common", {}), **data.get(level, {})}
    return MappingProxyType({k: str(v) for k, v in merged.items()})


# A measured speed-up in the words of the level without numbers, in steps a child can tell apart: (upper bound of the
# ratio, words). One table for every page that says it (the Watch page's D1, the busy-server lab's D1).
SPEED_WORDS: tuple[tuple[float, str], ...] = (
    (0.95, "slower"),
    (1.10, "about the same speed"),
    (1.35, "a bit faster"),
    (1.75, "half again as fast"),
    (2.50, "about twice as fast"),
    (float("inf"), "several times faster"),
)


def speed_words(speedup: float) -> str:
    """A measured speed-up in D1's words (SPEED_WORDS)."""
    return next(words for bound, words in SPEED_WORDS if speedup < bound)
