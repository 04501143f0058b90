"""Winners only beyond noise: which measured speed-ups lead, and by how much a lead must beat the timing spread."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# A lead smaller than this is never called a win, however steady the run looked (a floor we chose, not a
# measurement): with one short run per item, a page redraw or another visitor's run can move a few per cent.
MIN_MARGIN = 0.10


def spread(values: Iterable[float | None]) -> float | None:
    """(largest − smallest) ÷ smallest of timings that measure the same thing; None with fewer than two."""
    vals = [v for v in values if v is not None and v > 0]
    if len(vals) < 2:
        return None
    return max(vals) / min(vals) - 1.0


def repeats_spread(item: Any) -> float | None:
    """How far one item's repeated speed-ups differed (`speedup_low`, `speedup_high` over `repeats` runs: a lab's bar
    or point, its whisker): highest ÷ lowest − 1; None with one run."""
    return spread((item.speedup_low, item.speedup_high)) if item.repeats > 1 else None


def widest_repeats_spread(items: Iterable[Any]) -> float | None:
    """The largest repeats_spread of the items: a measurement's noise where each item was run several times."""
    return max((s for s in map(repeats_spread, items) if s is not None), default=None)


def margin(spread_: float | None) -> float:
    """The relative lead a winner needs: the measured spread, never less than MIN_MARGIN."""
    return max(MIN_MARGIN, spread_ or 0.0)


def leaders(items: Sequence[T], value: Callable[[T], float | None], margin_: float) -> tuple[T, ...]:
    """The best item and every item within `margin_` of it (best ÷ other − 1 ≤ margin), best first.

    One leader is a winner; several are "about the same" (a prediction of any of them is right)."""
    scored = sorted((i for i in items if (value(i) or 0) > 0), key=lambda i: -value(i))  # type: ignore[operator]
    if not scored:
        return ()
    top = value(scored[0])
    return tuple(i for i in scored if top / value(i) - 1.0 <= margin_ + 1e-12)  # type: ignore[operator]


def beats(a: float, b: float, margin_: float) -> bool:
    """Whether `a` leads `b` by more than the margin (relative)."""
    return b > 0 and a / b - 1.0 > margin_
