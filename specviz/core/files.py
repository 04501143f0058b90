"""Where specviz keeps what it builds (the cache folder) and how two processes take turns building it."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

try:  # advisory file locks keep two processes (the app, a CLI run, a test worker) from building one thing at once
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS: build without a lock
    fcntl = None  # type: ignore[assignment]


def cache_dir() -> Path:
    """Where converted weights live: $SPECVIZ_CACHE, else ~/.cache/specviz."""
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz").expanduser()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path`, held while one process builds something in the cache."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read 1 MiB at a time (the datastore's and the head's checks)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
