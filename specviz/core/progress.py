"""What a long job yields as it goes (Progress), and the two ways to drain a job's generator."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

# A job is any generator: it yields items as it goes (RoundTraces of a generation, or Progress
# records of a lab measurement) and returns its result (a Generation, a lab result).
JobSteps = Generator[Any, None, Any]


@dataclass(frozen=True)
class Progress:
    """What a long lab job yields as it goes: `done` of `total` units, and what it is doing."""

    done: int
    total: int
    message: str

    @property
    def fraction(self) -> float:
        return 0.0 if self.total <= 0 else max(0.0, min(1.0, self.done / self.total))


def with_progress(steps: JobSteps, done_before: int, total: int, label: str,
                  budget: int) -> Generator[Progress, None, Any]:
    """Drain a generation inside a lab job, yielding a Progress per round (new tokens are the unit).

    `done_before` units of `total` were done before this run, which makes at most `budget` tokens.
    Returns the generation's own result (its Generation).
    """
    made = 0
    while True:
        try:
            r = next(steps)
        except StopIteration as stop:
            return stop.value
        made = min(made + len(r.new_ids), budget)
        yield Progress(done_before + made, total, f"{label}: {made}/{budget} tokens")


def drain(steps: JobSteps, on_item: Callable[[Any], None] | None = None) -> Any:
    """Run a job's generator to its end outside the runner (command lines, tests); returns its result."""
    while True:
        try:
            item = next(steps)
        except StopIteration as stop:
            return stop.value
        if on_item:
            on_item(item)
