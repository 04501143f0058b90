"""Preset prompts in the two groups the lessons refer to: predictable and creative text (also the benchmark's workloads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Group = Literal["predictable", "creative"]


@dataclass(frozen=True)
class Preset:
    """One ready-made prompt a teacher can pick instead of typing."""

    id: str  # stable key, used in the URL (?preset=code)
    group: Group  # predictable text drafts well; creative text is rejected more often
    title: str  # button label
    prompt: str  # raw text the models continue (no chat template)
    why: str  # one line for the teacher: what this prompt shows
    copies_prompt: bool = False  # the answer copies text from the prompt: prompt lookup (n-gram) applies


PRESETS: tuple[Preset, ...] = (
    Preset(
        "code", "predictable", "Code",
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "Code follows strict patterns, so the small model guesses most of it.",
    ),
    Preset(
        "json", "predictable", "A JSON object",
        'users = [\n    {"id": 1, "name": "Ada", "email": "ada@example.com", "active": true},\n'
        '    {"id": 2, "name": "Grace", "email": "grace@example.com", "active": true},\n'
        '    {"id": 3,',
        "Repeated structure: keys, quotes and commas are easy to predict.",
    ),
    Preset(
        "list", "predictable", "A numbered list",
        "The planets of the solar system, in order from the Sun:\n1. Mercury\n2.",
        "A list with a known order: each next item is almost certain.",
    ),
    Preset(
        "copy", "predictable", "Copying from the prompt",
        "Original: The quick brown fox jumps over the lazy dog while the sleepy cat watches "
        "from the warm windowsill.\nCopy: The quick brown fox",
        "Copying text that is already in the prompt: a guesser can look it up.",
        copies_prompt=True,
    ),
    Preset(
        "story", "creative", "A story opening",
        "Once upon a time, in a village at the edge of a great forest,",
        "Many good continuations exist, so the guesses are often wrong.",
    ),
    Preset(
        "poem", "creative", "A poem",
        "A short poem about the sea at night:\n\n",
        "Poetry is high-entropy text: expect more red crosses and less speed-up.",
    ),
)

GROUP_TITLES: dict[Group, str] = {"predictable": "Predictable", "creative": "Creative"}
DEFAULT_PRESET = "code"


def get_preset(preset_id: str) -> Preset | None:
    """The preset with this id, or None."""
    return next((p for p in PRESETS if p.id == preset_id), None)


def presets_in(group: Group) -> tuple[Preset, ...]:
    """Presets of one group, in display order."""
    return tuple(p for p in PRESETS if p.group == group)
