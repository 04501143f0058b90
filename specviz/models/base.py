"""What every model source shares: the one-line PairError, the progress callback and out-of-memory as an error."""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

import torch
from torch import nn

LoadProgress = Callable[[float, str], None]  # load_pair's (fraction, message) callback; not core.progress.Progress


class PairError(Exception):
    """A user-facing loading failure; its message is one clear line."""


def _no_progress(fraction: float, message: str) -> None:
    """Default progress sink."""


def _span(report: LoadProgress, lo: float, hi: float) -> LoadProgress:
    """Map a sub-step's 0..1 onto lo..hi of the caller's bar."""
    return lambda f, msg: report(lo + (hi - lo) * min(max(f, 0.0), 1.0), msg)


@contextlib.contextmanager
def _oom_as_pair_error(what: str) -> Iterator[None]:
    """Out of memory becomes one line the app can show."""
    try:
        yield
    except (MemoryError, torch.OutOfMemoryError) as e:
        raise PairError(f"out of memory while loading {what}: close other programs or pick a smaller pair") from e
    except RuntimeError as e:
        if "alloc" in str(e).lower() or "out of memory" in str(e).lower():
            raise PairError(f"out of memory while loading {what}: close other programs or pick a smaller pair") from e
        raise


def _first_line(e: BaseException) -> str:
    """The first non-empty line of an exception message."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else "no details"


def _model_device(model: nn.Module) -> torch.device:
    """Device of a model's first parameter."""
    return next(model.parameters()).device


def pack_threads() -> int:
    """Threads for packing weights at load (fbgemm packs on one core and releases the GIL): this machine's cores, 2..4
    (more would hold more unpacked tensors in memory at once for little gain)."""
    return max(2, min(4, os.cpu_count() or 2))
