"""The settings of one visit as a frozen record (what every lab and job is keyed by), and the prompt checks every entry point shares.

Below the app layer: labs, the command line and the benchmark read these without importing
Streamlit glue. The app's round trip through a URL lives in specviz.app.settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specviz.core import drafters
from specviz.core.limits import DEFAULT_GAMMA, GAMMA_RANGE
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.lessons import Level

MAX_PROMPT_CHARS = 20_000  # a prompt box keeps this many characters (the model's context is checked separately)


@dataclass(frozen=True)
class Settings:
    """Everything the sidebar decides; frozen so pages can use it as (part of) a cache key."""

    level: Level = "d1"  # explanation depth: words and how much is shown, never the run; a fresh visit opens at the story
    pair: str = "qwen-coder"  # named target/draft pair from specviz.models
    drafter: str = drafters.DEFAULT  # a name in the drafter registry (specviz.core.drafters)
    mode: str = "greedy"  # greedy (argmax) or sample
    temperature: float = 0.8  # only used when sampling
    top_p: float = 0.95  # only used when sampling
    seed: int = 0  # only used when sampling: same seed, same dice
    gamma: int = DEFAULT_GAMMA  # draft length γ: tokens guessed per round (the ceiling when adaptive)
    adaptive: bool = False  # let the engine choose 0..γ each round (specviz.core.adaptive)
    max_new_tokens: int = 64  # stop after this many new tokens
    presenter: bool = False  # large type for a projector

    @property
    def sampling(self) -> SamplingConfig:
        if self.mode == "greedy":
            return SamplingConfig(mode="greedy")
        return SamplingConfig(mode="sample", temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def generation_config(self) -> GenerationConfig:
        """The engine config of a speculative run with these settings."""
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=self.gamma, adaptive=self.adaptive,
                                sampling=self.sampling)

    def baseline_config(self) -> GenerationConfig:
        """The target-only run's config: γ does not matter there, so it is fixed (one baseline serves every γ)."""
        return GenerationConfig(max_new_tokens=self.max_new_tokens, gamma=GAMMA_RANGE[0], sampling=self.sampling)


DEFAULTS = Settings()


def clean_prompt(prompt: str) -> tuple[str, list[str]]:
    """Text a tokenizer can take, and a note for each change: lone surrogates become U+FFFD, NUL bytes go.

    Lone surrogates arrive from undecodable command-line bytes or a broken link and make the
    tokenizer raise; NUL bytes are never meant as text. Everything else (emoji, right-to-left
    and mixed scripts, HTML, Markdown, LaTeX) is kept as typed: it is only ever shown escaped.
    """
    notes: list[str] = []
    if any("\ud800" <= ch <= "\udfff" for ch in prompt):
        n = sum("\ud800" <= ch <= "\udfff" for ch in prompt)
        prompt = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in prompt)
        notes.append(f"{n} invalid character{'s' if n != 1 else ''} (broken UTF-8) became � in the prompt.")
    if "\x00" in prompt:
        n = prompt.count("\x00")
        prompt = prompt.replace("\x00", "")
        notes.append(f"{n} NUL character{'s' if n != 1 else ''} removed from the prompt.")
    return prompt, notes


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """A prompt's ids as every entry point reads them: raw text with the tokenizer's own special tokens, no chat
    template (the models continue text); [] for a blank prompt."""
    return list(tokenizer(text)["input_ids"]) if text.strip() else []


def prompt_problem(prompt: str, n_prompt_tokens: int, context_length: int, max_new_tokens: int) -> str | None:
    """A friendly sentence when a prompt cannot run (empty, or too long for the model), else None."""
    if not prompt.strip():
        return "The prompt is empty: type something, or pick one of the presets above."
    if n_prompt_tokens == 0:
        return "The prompt turned into no tokens at all: type a few words."
    room = context_length - max_new_tokens
    if n_prompt_tokens > room:
        return (
            f"The prompt is {n_prompt_tokens:,} tokens long; with {max_new_tokens} new tokens that is more than "
            f"this model pair can read ({context_length:,} tokens). Shorten the prompt or lower “Max new tokens”."
        )
    return None


def bounded(value: Any, lo: int, hi: int, default: int) -> int:
    """A whole number within lo..hi whatever arrived (a widget's state is checked again before a job is built)."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return min(max(number, lo), hi)
