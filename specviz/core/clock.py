"""The clock a run's rounds are timed with: wall time when a run is alone; on a shared server, the time of the passes the run took part in.

Why: in a batch a run also waits while other runs' passes are computed (another pupil's draft
steps, say). Counting that wait would charge one run for another's work — a target-only baseline
would look slow because speculative runs beside it were drafting. So the executor sets, while it
advances a run, a clock that moves only during that run's own code and the passes that included
its rows (a shared pass counts in full for every run in it). A run alone reads the wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_clock: ContextVar[Callable[[], float]] = ContextVar("specviz_run_clock", default=time.perf_counter)


def now() -> float:
    """Seconds on the clock of the run being advanced (the wall clock outside a batch)."""
    return _clock.get()()


def ms_since(t0: float) -> float:
    """Milliseconds on the run's clock since `t0` (a value of `now()`)."""
    return (now() - t0) * 1000.0


@contextmanager
def run_clock(clock: Callable[[], float]) -> Iterator[None]:
    """Time the code run inside with `clock` (the executor, while it advances one run)."""
    token = _clock.set(clock)
    try:
        yield
    finally:
        _clock.reset(token)
