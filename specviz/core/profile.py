"""Where each millisecond of a round goes: lap timers inside a pass and a round, on only while a profile records.

A profile is recorded by running a run inside `recording(target)`: the lean pass (core.lean) laps its parts
(matmuls by shape, attention, the KV cache, norms and rotary, the output layer), a model drafter laps its
sampling, the round laps the acceptance rule and the cache roll-back, and whatever the laps do not cover is
Python between them. Off (the default), a lap is one call that returns at once: timed runs pay nothing that shows.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class _Off:
    """The laps of a run that no profile records: every call returns at once."""

    recording = False

    def start(self, role: str) -> None:
        return None

    def mark(self) -> None:
        return None

    def __call__(self, what: str, role: str | None = None) -> None:
        return None

    def matmul(self, name: str, layers: Any) -> None:
        return None

    def stop(self) -> None:
        return None

    def reset(self) -> None:
        return None


OFF = _Off()


class Laps:
    """Lap timers of one recording: each lap adds the time since the previous one to (role, what)."""

    recording = True

    def __init__(self, target: Any) -> None:
        self.target = target  # passes of this model are "verify" passes; any other model's are "draft" passes
        self.totals: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.role = "round"
        self._last = time.perf_counter()
        self._outer: list[tuple[str, float]] = []

    def role_of(self, model: Any) -> str:
        return "verify" if model is self.target else "draft"

    def start(self, role: str) -> None:
        """A pass of `role` begins: laps go to it until `stop` (passes do not nest)."""
        now = time.perf_counter()
        self._outer.append((self.role, now))
        self.role, self._last = role, now

    def mark(self) -> None:
        """Start timing a section here (the next lap measures from now, not from the previous lap)."""
        self._last = time.perf_counter()

    def __call__(self, what: str, role: str | None = None) -> None:
        """Add the time since the previous lap (or mark) to `what`, under the current pass's role or the one given."""
        now = time.perf_counter()
        key = (role or self.role, what)
        self.totals[key] += now - self._last
        self.calls[key] += 1
        self._last = now

    def matmul(self, name: str, layers: Any) -> None:
        """A lap for a matrix product, named by its layers' shape: "matmul q/k/v 1536×2048"."""
        if not isinstance(layers, (tuple, list)):
            layers = (layers,)
        n_in = getattr(layers[0], "in_features", 0)
        n_out = sum(getattr(m, "rows_kept", getattr(m, "out_features", 0)) for m in layers)
        self(f"matmul {name} {n_in}×{n_out}")

    def reset(self) -> None:
        """Forget what was lapped so far (the decoding loop calls it after the prefill: a profile is of rounds)."""
        self.totals.clear()
        self.calls.clear()
        self._last = time.perf_counter()

    def stop(self) -> None:
        """The pass ends: its wall time is recorded as (role, "pass"), and the laps go back to the round."""
        now = time.perf_counter()
        role, began = self._outer.pop()
        self.totals[(self.role, "pass")] += now - began
        self.calls[(self.role, "pass")] += 1
        self.role, self._last = role, now


_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("specviz_laps", default=OFF)


def laps() -> Any:
    """The laps of the profile recording in this thread, or OFF."""
    return _CURRENT.get()


@contextlib.contextmanager
def recording(target: Any) -> Iterator[Laps]:
    """Record a profile of everything run inside (in this thread): passes of `target` count as verify passes."""
    found = Laps(target)
    token = _CURRENT.set(found)
    try:
        yield found
    finally:
        _CURRENT.reset(token)


@dataclass(frozen=True)
class Part:
    """One line of a round profile: where (draft, verify or the round itself), what, and its ms per round."""

    role: str  # "draft", "verify" or "round"
    what: str  # e.g. "matmul 1536×8960", "attention", "kv cache", "sampling", "python"
    ms: float  # per round
    calls: float  # per round


@dataclass(frozen=True)
class RoundProfile:
    """Where a run's rounds spent their time, per round."""

    rounds: int
    round_ms: float  # wall time per round (the run's decode time / rounds)
    parts: tuple[Part, ...]  # largest first within each role; each role's "python" is its pass time the laps missed

    def role_ms(self, role: str) -> float:
        return sum(p.ms for p in self.parts if p.role == role)


def summarise(found: Laps, rounds: int, decode_ms: float) -> RoundProfile:
    """The recording's laps as ms per round, with each pass's unlapped time as that role's Python overhead and the
    round's own time outside passes (the rule, the cache roll-back, the loop) as the round's parts."""
    n = max(rounds, 1)
    parts: list[Part] = []
    for role in ("draft", "verify"):
        inside = {w: t for (r, w), t in found.totals.items() if r == role and w != "pass"}
        pass_s = found.totals.get((role, "pass"), 0.0)
        for what, t in sorted(inside.items(), key=lambda kv: -kv[1]):
            parts.append(Part(role, what, 1000 * t / n, found.calls[(role, what)] / n))
        if pass_s:
            parts.append(Part(role, "python", 1000 * max(0.0, pass_s - sum(inside.values())) / n,
                              found.calls[(role, "pass")] / n))
    passes_ms = sum(p.ms for p in parts)
    lapped = {w: t for (r, w), t in found.totals.items() if r == "round"}
    for what, t in sorted(lapped.items(), key=lambda kv: -kv[1]):
        parts.append(Part("round", what, 1000 * t / n, found.calls[("round", what)] / n))
    round_ms = decode_ms / n
    rest = round_ms - passes_ms - sum(1000 * t / n for t in lapped.values())
    parts.append(Part("round", "python", max(0.0, rest), 1.0))
    return RoundProfile(rounds, round_ms, tuple(parts))
