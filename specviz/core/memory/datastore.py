"""The suffix drafter's read-only datastore: the Python standard library's sources on this machine, tokenized by a pair, bounded and checked.

Why these sources: they are on every machine that runs the app (no download), they are code (the
default pair is a coder), and they are not the presets' answers, so a "cold" benchmark with the
datastore alone measures memory of other code, not of the benchmark itself. The file is written
once per pair into the cache (`specviz build-datastore`, and `prepare`) and checked when loaded:
its sha256, the tokenizer it was made with, and its ids against the vocabulary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sysconfig
import tempfile
from pathlib import Path
from collections.abc import Callable
from typing import Any, Iterator

import numpy as np

from specviz.core.files import cache_dir, file_lock, sha256_file
from specviz.core.memory.index import SuffixIndex

LoadProgress = Callable[[float, str], None]  # a load's (fraction, message) callback, as models.base names it

FORMAT = 1
MAX_TOKENS = 1_000_000  # the bound: 4 MB of int32 ids, a suffix array of 8 MB, built in well under a second
# folders of the standard library left out: tests, demos and GUI toolkits are not the code a class writes
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages",
                       "dist-packages", "__pycache__", "config-3.11-x86_64-linux-gnu"})
PROBE = 'def add(a, b):\n    """Return a + b."""\n    return a + b\n'  # its ids identify the tokenizer


class DatastoreError(RuntimeError):
    """A datastore file that is missing, damaged or made for another tokenizer."""


def source_files(root: Path | None = None) -> list[Path]:
    """The standard library's .py files, in a fixed order (sorted paths), tests and GUI toolkits left out."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    out = [p for p in base.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(base).parts[:-1])]
    return sorted(out, key=lambda p: p.relative_to(base).as_posix())


def folder(pair_name: str) -> Path:
    """Where a pair's datastore lives (a hub pair's name, "hf:A,B", made safe for a folder name)."""
    return cache_dir() / "datastore" / re.sub(r"[^A-Za-z0-9._-]", "_", pair_name)


def tokenizer_id(tokenizer: Any) -> str:
    """A short hash of how the tokenizer splits a fixed probe (another tokenizer splits it otherwise)."""
    ids = list(tokenizer(PROBE)["input_ids"])
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


def build(pair_name: str, tokenizer: Any, vocab_size: int, max_tokens: int = MAX_TOKENS, root: Path | None = None,
          progress: LoadProgress | None = None) -> Path:
    """Tokenize the sources file by file until max_tokens, write ids, file offsets and a manifest; return the folder."""
    if max_tokens < 1:
        raise ValueError("a datastore holds at least one token")
    files = source_files(root)
    if not files:
        raise DatastoreError(f"no Python sources found under {root or sysconfig.get_paths()['stdlib']}")
    chunks: list[np.ndarray] = []
    total = shown = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a file that is not UTF-8 text is not code the app would write
        ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int32)[: max_tokens - total]
        if ids.size:
            chunks.append(ids)
            total += int(ids.size)
        if progress is not None and total * 10 // max_tokens > shown:  # one line per tenth of the bound
            shown = total * 10 // max_tokens
            progress(total / max_tokens, f"datastore: {total:,} of {max_tokens:,} tokens")
        if total >= max_tokens:
            break
    if not chunks:
        raise DatastoreError("the Python sources gave no tokens")
    tokens = np.concatenate(chunks)
    if int(tokens.max()) >= vocab_size:
        raise DatastoreError(f"the tokenizer made ids up to {int(tokens.max())}, past the vocabulary ({vocab_size})")
    offsets = np.cumsum([0] + [c.size for c in chunks]).astype(np.int64)
    out = folder(pair_name)
    out.mkdir(parents=True, exist_ok=True)
    with _part(out, "tokens.npz") as part:
        with part.open("wb") as f:
            np.savez(f, tokens=tokens, offsets=offsets)
        digest = sha256_file(part)
    manifest = {"format": FORMAT, "pair": pair_name, "source": "the Python standard library's .py files",
                "files": len(chunks), "tokens": int(tokens.size), "max_tokens": max_tokens, "sha256": digest,
                "tokenizer": tokenizer_id(tokenizer), "vocab_size": vocab_size,
                "python": sysconfig.get_python_version()}
    with _part(out, "manifest.json") as part:
        part.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return out


@contextlib.contextmanager
def _part(out: Path, name: str) -> Iterator[Path]:
    """A temp file of this process beside `out / name`, moved onto it when the block ends (removed if it fails):
    a reader never sees a half-written file, and two writers never write into one."""
    fd, raw = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out)
    os.close(fd)
    part = Path(raw)
    try:
        yield part
        part.replace(out / name)
    finally:
        part.unlink(missing_ok=True)


def manifest(pair_name: str) -> dict[str, Any] | None:
    """The datastore's manifest, or None when none was built for this pair."""
    path = folder(pair_name) / "manifest.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def load(pair_name: str, tokenizer: Any, vocab_size: int) -> SuffixIndex:
    """The checked datastore as a suffix index (one document per source file); a clear error when it does not fit."""
    found = manifest(pair_name)
    data = folder(pair_name) / "tokens.npz"
    if found is None or not data.exists():
        raise DatastoreError(f"no datastore for {pair_name}: run `python -m specviz build-datastore --pair {pair_name}`")
    if found.get("format") != FORMAT:
        raise DatastoreError(f"the datastore of {pair_name} has format {found.get('format')}, not {FORMAT}: build it again")
    if sha256_file(data) != found["sha256"]:
        raise DatastoreError(f"the datastore of {pair_name} does not match its sha256 (damaged?): build it again")
    if found["tokenizer"] != tokenizer_id(tokenizer) or found["vocab_size"] != vocab_size:
        raise DatastoreError(f"the datastore of {pair_name} was made with another tokenizer: build it again")
    with np.load(data) as npz:
        tokens, offsets = npz["tokens"], npz["offsets"]
    if tokens.size != found["tokens"] or (tokens.size and int(tokens.max()) >= vocab_size):
        raise DatastoreError(f"the datastore of {pair_name} holds other ids than its manifest says: build it again")
    docs = [tokens[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return SuffixIndex(docs, vocab_size)


def ensure(pair_name: str, tokenizer: Any, vocab_size: int,
           progress: LoadProgress | None = None) -> SuffixIndex:
    """The datastore, built first when this pair has none (or a damaged or foreign one)."""
    try:
        return load(pair_name, tokenizer, vocab_size)
    except DatastoreError:
        pass
    place = folder(pair_name)
    with file_lock(place.parent / f".{place.name}.lock"):  # one builder; the others wait
        try:
            return load(pair_name, tokenizer, vocab_size)  # another process built it while this one waited
        except DatastoreError:
            build(pair_name, tokenizer, vocab_size, progress=progress)
    return load(pair_name, tokenizer, vocab_size)


_LOADED: dict[tuple[str, str], SuffixIndex] = {}  # one index per pair and cache folder, shared by every visitor (read-only)


def for_pair(pair: Any, progress: LoadProgress | None = None) -> SuffixIndex:
    """The loaded pair's datastore, loaded once per process (built first when missing)."""
    pair_name = pair.spec.name
    key = (pair_name, str(folder(pair_name)))
    if key not in _LOADED:
        _LOADED[key] = ensure(pair_name, pair.tokenizer, vocab_size(pair), progress)
    return _LOADED[key]


def vocab_size(pair: Any) -> int:
    """The ids a memory of this pair may hold: the target's vocabulary (what q rows are fitted to)."""
    return int(pair.target.config.vocab_size)
