"""Watch it work: one speculative run and its target-only baseline, keyed by everything that changes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specviz.app.settings import Settings
from specviz.core.drafters import make_drafter
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.progress import JobSteps


@dataclass(frozen=True)
class RunRef:
    """What the page keeps in session_state about a run: keys into the shared runner, nothing heavy."""

    spec_key: tuple[Any, ...]  # the speculative run: its rounds stream in and are replayed
    plain_key: tuple[Any, ...]  # the target-only baseline it is compared with
    prompt: str
    settings: Settings

    @property
    def keys(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self.spec_key, self.plain_key


def run_ref(pair: str, prompt: str, s: Settings) -> RunRef:
    """The keys of a run with these settings (γ and the drafter do not change the baseline, so it is shared)."""
    return RunRef(("watch.spec", pair, prompt, s.drafter, s.generation_config()),
                  ("watch.plain", pair, prompt, s.baseline_config()), prompt, s)


def speculative_steps(pair: Any, prompt_ids: Sequence[int], s: Settings) -> JobSteps:
    """The speculative run: yields a RoundTrace per round, returns the Generation."""
    drafter = make_drafter(s.drafter, pair.draft, adaptive=s.adaptive)
    return speculative_generate(pair.target, drafter, pair.tokenizer, list(prompt_ids), s.generation_config(),
                                pair.eos_ids)


def baseline_steps(pair: Any, prompt_ids: Sequence[int], s: Settings) -> JobSteps:
    """The target alone, one token per step, with the same decoding: the run the speed-up is measured against."""
    return autoregressive_generate(pair.target, pair.tokenizer, list(prompt_ids), s.baseline_config(), pair.eos_ids)
