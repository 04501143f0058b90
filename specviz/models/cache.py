"""The safetensors cache of each GGUF source: a folder per form, built from the GGUF (or migrated) and trusted by its manifest.

A build from the GGUF runs in a child process: however carefully it streams, the heap it leaves behind (the GGUF
reader's buffers, the tokenizer's build, freed blocks glibc keeps) would stay in the app's process for its whole life,
and on a first start it pushed the default pair over the 4.5 GB a later start needs. The child's peak is one
tensor and one shard; when it exits, all of it goes back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specviz.models import stream
from specviz.models.base import LoadProgress, PairError, _first_line, _no_progress, _oom_as_pair_error, _span
from specviz.models.cached import _load_cached_tokenizer
from specviz.models.catalogue import GgufPart, GgufSource
from specviz.models.stream import Form
from specviz.models.locate import _verified_gguf, cache_dir, file_lock

_CACHE_FORMAT = 2  # bump when the cache layout changes so old folders are rebuilt
_LEGACY_FORMAT = 1  # fp32 folders of specviz before the compact forms: still read for fp32, replaced on a default load
_MANIFEST = "specviz-manifest.json"


def cache_folder(src: GgufSource, form: Form = "fp32") -> Path:
    """The folder of one model's cache in one form (the fp32 one keeps its old name)."""
    return cache_dir() / (src.key if form == "fp32" else f"{src.key}-{form}")


def ensure_cached(src: GgufSource, progress: LoadProgress | None = None, form: Form = "fp32") -> Path:
    """The cache folder of `src` in `form`, built when missing or stale.

    A compact form is built from an fp32 folder of older specviz where there is one (faster than the
    GGUF), and that folder is then removed with a note: the default load never keeps both.
    """
    report = progress or _no_progress
    final = cache_folder(src, form)
    if _cache_is_valid(final, src, form):
        report(1.0, f"{src.title}: found in the cache")
        return final
    cache_dir().mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir() / f".{final.name}.lock"):
        if _cache_is_valid(final, src, form):  # another process finished it while we waited
            report(1.0, f"{src.title}: found in the cache")
            return final
        _remove_leftovers(final.name)
        legacy = cache_folder(src, "fp32")
        if form not in ("fp32", "gguf") and _cache_is_valid(legacy, src, "fp32", legacy_only=True):
            _migrate(legacy, src, form, final, report)
            return final
        with _source_file(src, form, _span(report, 0.0, 0.2)) as gguf_path:
            _build_in_child(src, form, final, gguf_path, _span(report, 0.2, 1.0))
    return final


@contextlib.contextmanager
def _source_file(src: GgufSource, form: Form, report: LoadProgress) -> Iterator[Path]:
    """The GGUF file a form is built from: the gguf form's own copy where it is cached (verified when it was made, and
    trusted as every cache folder is, by its manifest), else the parts joined and verified again. The default's first
    start caches that form, so a later switch to fp16w or fp32 joins nothing (20-30 s and 1.6 GB of writing)."""
    from specviz.models.gguf_model import GGUF_FILE  # (gguf_model reads this module's folders: imported when used)

    cached_form = cache_folder(src, "gguf")
    if form != "gguf" and _cache_is_valid(cached_form, src, "gguf"):
        report(1.0, f"{src.title}: its GGUF file, from the cache")
        yield cached_form / GGUF_FILE
        return
    with _verified_gguf(src, report) as path:
        yield path


def _build_from_gguf(src: GgufSource, form: Form, final: Path, gguf_path: Path, report: LoadProgress) -> None:
    """Stream a verified GGUF into the cache folder `final` (the child process's whole job)."""
    if form == "gguf":
        _build_gguf_form(src, final, gguf_path, report)
        return
    with _oom_as_pair_error(src.title), stream.one_gguf_reader(gguf_path):
        report(0.0, f"{src.title}: reading the tokenizer from GGUF")
        tokenizer = _gguf_tokenizer(gguf_path)
        config = stream.gguf_config(gguf_path)
        count, tensors = stream.gguf_tensors(gguf_path, config)
        _write_cache(tensors, count, config, tokenizer, src, form, final, _span(report, 0.06, 1.0))


def _build_gguf_form(src: GgufSource, final: Path, gguf_path: Path, report: LoadProgress) -> None:
    """The gguf form: the verified file itself (moved in where it was joined in the cache, else linked or copied),
    its config, tokenizer and tensor table; nothing is dequantized."""
    from specviz.models import gguf_model

    with _temp_folder(final) as tmp:
        # one parse of the file's metadata for the tokenizer, the config and the table (each parsed it again: ~7 s)
        with _oom_as_pair_error(src.title), stream.one_gguf_reader(gguf_path):
            report(0.0, f"{src.title}: reading the tokenizer from GGUF")
            tokenizer = _gguf_tokenizer(gguf_path)
            report(0.5, f"{src.title}: reading the model's settings and tensor table")
            config = stream.gguf_config(gguf_path)
            gguf_model.write_table(gguf_path, tmp / gguf_model.TABLE)
        _place_file(gguf_path, tmp / gguf_model.GGUF_FILE, joined=len(src.parts) > 1)
        _publish(tmp, final, config, tokenizer, src, "gguf", 0)
        report(1.0, f"{src.title}: cached as its GGUF file ({_folder_gb(final):.2f} GB)")


def _place_file(path: Path, dest: Path, joined: bool) -> None:
    """A file joined from parts is moved in (_verified_gguf deletes its temporary copy after the build); a whole file
    in a package, installed or fetched into the cache's packages/, is linked or copied and stays where it is."""
    if joined:
        os.replace(path, dest)
        return
    try:
        os.link(path, dest)
    except OSError:  # another file system, or links not allowed
        shutil.copyfile(path, dest)


def _build_in_child(src: GgufSource, form: Form, final: Path, gguf_path: Path, report: LoadProgress) -> None:
    """Run _build_from_gguf in a fresh Python process, relaying its progress; its failure is one PairError line."""
    job = json.dumps({"src": dataclasses.asdict(src), "form": form, "final": str(final), "gguf": str(gguf_path)})
    root = str(Path(__file__).resolve().parents[2])  # where this specviz is imported from, whatever the child's cwd
    env = {**os.environ, "SPECVIZ_CACHE": str(cache_dir()),  # the very folder this process holds the lock in
           "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    code_line = "import sys; from specviz.models.cache import _child_main; sys.exit(_child_main())"
    proc = subprocess.Popen([sys.executable, "-c", code_line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=False, env=env)
    failure = ""
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(job.encode())
        proc.stdin.close()
        for raw in proc.stdout:  # one JSON object a line: progress, or the error that ended the build
            msg = json.loads(raw)
            if "error" in msg:
                failure = msg["error"]
            else:
                report(msg["f"], msg["m"])
        code = proc.wait()
    except BaseException:  # interrupted (Ctrl-C, a stopped app): the child must not build on alone
        proc.kill()
        proc.wait()
        raise
    if code != 0:
        if not failure and code < 0:  # killed by a signal: on Linux almost always the out-of-memory killer
            failure = f"out of memory while building the cache of {src.title}: close other programs or pick a smaller pair"
        raise PairError(failure or f"building the cache of {src.title} failed (exit {code}); see the messages above")


def _child_main() -> int:
    """The child's side of _build_in_child: the job on stdin, progress and any error as JSON lines on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints goes to stderr, never into the progress lines

    def say(fraction: float, message: str) -> None:
        out.write(json.dumps({"f": fraction, "m": message}) + "\n")
        out.flush()

    job = json.loads(sys.stdin.buffer.read())
    src = GgufSource(**{**job["src"], "parts": tuple(GgufPart(**part) for part in job["src"]["parts"])})
    try:
        _build_from_gguf(src, job["form"], Path(job["final"]), Path(job["gguf"]), say)
    except PairError as e:
        out.write(json.dumps({"error": str(e)}) + "\n")
        return 1
    except Exception as e:  # a GGUF its sum vouches for but the reader cannot take: one line for the page, the rest below
        traceback.print_exc()
        out.write(json.dumps({"error": f"building the cache of {src.title} failed: {_first_line(e)}"}) + "\n")
        return 1
    return 0


def _migrate(legacy: Path, src: GgufSource, form: Form, final: Path, report: LoadProgress) -> None:
    """Build a compact form from an fp32 folder of older specviz, then remove that folder, saying so."""
    gb = _folder_gb(legacy)
    report(0.0, f"{src.title}: converting the fp32 cache of an older specviz ({gb:.1f} GB) to {form}")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(legacy, local_files_only=True, trust_remote_code=False)
    files = stream.shard_files(legacy)
    count = sum(len(stream.read_header(f)) - 1 for f in files)
    tensors = (item for f in files for item in stream.file_tensors(f))  # one tensor at a time: no fp32 model in memory
    _write_cache(tensors, count, config, _load_cached_tokenizer(legacy), src, form, final, _span(report, 0.05, 0.95))
    shutil.rmtree(legacy, ignore_errors=True)
    report(1.0, f"{src.title}: cached in {form}; removed the old fp32 cache ({gb:.1f} GB at {legacy}), "
                f"which is converted again only if fp32 is asked for")


def _folder_gb(folder: Path) -> float:
    """Size of a cache folder's files in GB (10^9 bytes), for the progress notes."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 1e9


def _cache_is_valid(folder: Path, src: GgufSource, form: Form = "fp32", legacy_only: bool = False) -> bool:
    """Trust a cache only if its manifest (written last, then renamed in) matches source, form and files.

    An fp32 folder written before the forms existed (format 1, no form recorded) still serves fp32;
    `legacy_only` asks for exactly such a folder (the one a default load migrates).
    """
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    legacy = manifest.get("format") == _LEGACY_FORMAT and form == "fp32"
    current = manifest.get("format") == _CACHE_FORMAT and manifest.get("form") == form
    if not (legacy if legacy_only else legacy or current) or manifest.get("source_sha256") != src.sha256:
        return False
    files = manifest.get("files") or {}
    # shards come with their index (transformers reads the folder through it); one file of older specviz needs none
    indexed = "model.safetensors" in files or "model.safetensors.index.json" in files or "model.gguf" in files
    return bool(files) and indexed and all(_size(folder / f) == n for f, n in files.items())


def _size(path: Path) -> int:
    """File size, or -1 when missing."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _remove_leftovers(name: str) -> None:
    """Delete temp folders of an interrupted build of the folder `name` (we hold its lock, so none is live)."""
    for stale in cache_dir().glob(f".{name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _gguf_tokenizer(gguf_path: Path) -> Any:
    """The tokenizer stored in a GGUF file."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False)


def _write_cache(tensors: stream.Tensors, count: int, config: Any, tokenizer: Any, src: GgufSource, form: Form,
                 final: Path, report: LoadProgress) -> None:
    """Stream fp32 tensors into a cache folder of `form` (a temp folder, checked, then renamed into place).

    One tensor is brought to its form at a time, with the very calls a load in that precision makes, and
    written in shards that are read back and checked (stream.write_shards): the peak memory is about one
    shard and one tensor, never a whole fp32 model (the 1.5B target's is 7 GB).
    """
    with _temp_folder(final) as tmp:
        with _oom_as_pair_error(src.title), torch.no_grad():
            lay = stream.layout(config, form)
            say = lambda f, m: report(0.95 * f, f"{src.title}: {m}")  # noqa: E731
            checked = stream.write_shards(tensors, lay, tmp, count, say)
        _publish(tmp, final, config, tokenizer, src, form, checked)
        report(1.0, f"{src.title}: cached in {form} ({_folder_gb(final):.1f} GB)")


@contextlib.contextmanager
def _temp_folder(final: Path) -> Iterator[Path]:
    """A folder to build `final` in, beside it in the cache; removed afterwards whatever happens (a finished one has
    been renamed into place by then)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=cache_dir()))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder once renamed
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path, config: Any, tokenizer: Any, src: GgufSource, form: Form, checked: int) -> None:
    """The model's settings and tokenizer beside its weights, the manifest last (it vouches for the rest), then the
    folder renamed into place: atomic, so a cache folder is complete or absent."""
    from transformers import GenerationConfig

    config.save_pretrained(tmp)
    GenerationConfig.from_model_config(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _write_manifest(tmp, src, form, checked)
    if final.exists():  # stale or incomplete: replace (we hold the lock)
        shutil.rmtree(final)
    os.replace(tmp, final)


def write_model_cache(model: nn.Module, tokenizer: Any, src: GgufSource, form: Form, final: Path,
                      report: LoadProgress = _no_progress) -> None:
    """A cache folder of `form` from an fp32 model in memory (tests build tiny models this way)."""
    tensors = list(stream.model_tensors(model))
    _write_cache(iter(tensors), len(tensors), model.config, tokenizer, src, form, final, report)


def _write_manifest(folder: Path, src: GgufSource, form: Form, checked: int) -> None:
    """Record what the folder was built from; written last and fsynced, so it vouches for the rest."""
    import transformers

    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {
        "format": _CACHE_FORMAT,
        "form": form,
        "model": src.title,
        "source_file": src.filename,
        "source_sha256": src.sha256,
        "files": files,
        "checked_layers": checked,  # linears rebuilt from the file and found equal to their precision's layer
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    path = folder / _MANIFEST
    with open(path, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
