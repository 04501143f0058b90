"""Load a model and its tokenizer from a cache folder, one tensor at a time (fp32, fp16-weight or int8 layers)."""

from __future__ import annotations

import collections
import gc
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from specviz.models import int8w, rowgemm, stream
from specviz.models.half import empty_half_linears
from specviz.models.base import PairError, _oom_as_pair_error


_INT8_PARTS = stream.INT8_PARTS


def _return_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc only; elsewhere later allocations reuse them)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _load_cached_tokenizer(folder: Path) -> Any:
    """The tokenizer saved beside the weights (building one from GGUF takes 6-18 s), without Python copies of its
    vocabulary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    _drop_python_vocabulary(tokenizer)
    return tokenizer


def _drop_python_vocabulary(tokenizer: Any) -> None:
    """Let go of the vocabulary and merges a fast tokenizer's constructor keeps as Python objects once its Rust
    tokenizer is built from them.

    transformers' Qwen2Tokenizer (and the other BPE tokenizers of its TokenizersBackend) passes `_vocab` and `_merges`
    to the Rust BPE model, which copies them, and never reads them again: for Qwen's 151,936 tokens and 151,387 merges
    that is 47 MiB of Python objects, 90 MiB resident with the heap they hold (129 -> 39 MiB for the whole tokenizer,
    measured on the Ice Lake Xeon, 2026-12-07), and the laptop promise counts every MiB. Tokens, decoding and
    save_pretrained's files are the same without them (tests/test_models.py)."""
    if getattr(tokenizer, "_tokenizer", None) is None:  # not a Rust-backed tokenizer: nothing was copied
        return
    kept = [name for name in ("_vocab", "_merges") if getattr(tokenizer, name, None) is not None]
    for name in kept:
        setattr(tokenizer, name, None)
    if kept:
        gc.collect()
        _return_freed_memory()


def _load_cached_model(folder: Path, title: str, dtype: torch.dtype = torch.float32, half: bool = False,
                       int8_kernel: rowgemm.Kernel | None = None) -> nn.Module:
    """A causal LM in `dtype` from a local safetensors folder (no network, no remote code).

    The model is built empty and each tensor is read from the file with plain reads, cast, and put
    in place, so the peak memory is the model in `dtype` plus one tensor: no fp32 copy of a bf16
    model, and no memory-mapped file pages counted on top (from_pretrained maps the file, and
    copying out of the mapping held both: 14 GB at the peak for the fp32 1.5B target). With `half`,
    every linear is an fp16-weight HalfLinear filled as its weight is read (models.half) from an fp16
    or fp32 file: the fp32 matrices are never all in memory at once. Layers stored in int8 (an int8
    draft's cache) come back as the same int8 layers, or, with `int8_kernel`, straight as the rowgemm int8 layers
    (models.int8w) a draft on that kernel becomes anyway. An fp32 model's input embedding is the one tensor
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
        rowgemm.preallocate(model)  # layers that share an input get one panel tensor, filled in place below
        model.to_empty(device="cpu")  # storage without values: every tensor is filled below
        mapped = {_param_name(model, model.get_input_embeddings().weight)} if dtype == torch.float32 else set()
        extras: dict[str, torch.Tensor] = {}
        places: dict[str, tuple[Path, int, tuple[int, ...]]] = {}
        missing = _read_weights(paths, model, sinks, mapped, extras, places)
        missing -= {f"{n}.weight" for n in int8_names}
        _rebuild_buffers(model, config)
        if missing - _not_in_file(model, config) or len(extras) != len(_INT8_PARTS) * len(int8_names):
            raise PairError(f"{title}: the cache lacks {sorted(missing)[:3]}; delete {folder} to rebuild it")
        _fill_int8(model, slots, extras, int8_kernel)
        head = sinks.get("lm_head.weight")
        if head is not None and "lm_head.weight" in missing:  # a tied head: its own fp16 copy of the embedding
            head.load(model.get_input_embeddings().weight)
        elif not half and "lm_head" not in slots:
            model.tie_weights()
        _rows_from_file(model, places)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_dict(json.loads((folder / "generation_config.json").read_text()))
    return model.eval()


def _rows_from_file(model: nn.Module, places: dict[str, tuple[Path, int, tuple[int, ...]]]) -> None:
    """Put a FileRows in place of a mapped input embedding that nothing else reads whole (its head is not tied to it)."""
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    for name, (path, offset, shape) in places.items():
        tied = isinstance(out, nn.Linear) and out.weight is emb.weight
        if not tied and name == _param_name(model, emb.weight):
            model.set_input_embeddings(FileRows(path, offset, shape, emb.weight, emb.padding_idx))


class FileRows(nn.Module):
    """An input embedding read from its cache file row by row (os.pread): a step's few rows are copied out, and
    nothing of the file stays resident in this process.

    Why: mapped, each first touch of a row brought its neighbours in too (read-ahead, or the kernel's fault-around
    where the file was in the page cache): one 32-token tree run left 80 MB of embedding pages resident beside the
    default pair, and a class's many prompts keep adding rows. The values are the file's fp32 rows, as the mapping's.
    `weight` is still the mapped tensor, for the rare reader of the whole matrix.
    """

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], mapped: torch.Tensor,
                 padding_idx: int | None = None) -> None:
        super().__init__()
        self.path, self.offset = Path(path), int(offset)
        self.num_embeddings, self.embedding_dim = int(shape[0]), int(shape[1])
        self.padding_idx = padding_idx
        self._fd = os.open(self.path, os.O_RDONLY)
        self._row_bytes = self.embedding_dim * 4
        object.__setattr__(self, "_mapped", mapped)  # not a parameter: the model's tensors stay the resident ones

    @property
    def weight(self) -> torch.Tensor:
        return self._mapped

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        order = {i: j for j, i in enumerate(dict.fromkeys(flat))}  # each distinct row read once
        rows = np.empty((len(order), self.embedding_dim), dtype=np.float32)
        for i, j in order.items():
            if not 0 <= i < self.num_embeddings:
                raise IndexError(f"token id {i} is outside the embedding's {self.num_embeddings} rows")
            got = os.preadv(self._fd, [memoryview(rows[j])], self.offset + i * self._row_bytes)
            if got != self._row_bytes:
                raise OSError(f"{self.path}: a short read of row {i} ({got} of {self._row_bytes} bytes)")
        out = torch.from_numpy(rows)[torch.tensor([order[i] for i in flat], dtype=torch.long)]
        return out.reshape(*ids.shape, self.embedding_dim)

    def __deepcopy__(self, memo: dict) -> "FileRows":
        """A copy reads the same file (read-only): it shares this one."""
        memo[id(self)] = self
        return self

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, read row by row from {self.path.name}"


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


def _fill_int8(model: nn.Module, slots: dict[str, _Int8Slot], parts: dict[str, torch.Tensor],
               kernel: rowgemm.Kernel | None = None) -> None:
    """Replace each slot by the dynamic int8 layer of its stored weight (the layer quantize_int8 made, bit for bit),
    or with `kernel` by the rowgemm int8 layer int8w_linears would make of it."""
    for name, slot in slots.items():
        bias = None if slot.bias is None else slot.bias.detach()
        stored = [parts.pop(name + p) for p in _INT8_PARTS]  # let go of each part once its layer holds it
        layer = int8w.int8w_from_parts(*stored, bias, kernel) if kernel else stream.int8_from_parts(*stored, bias)
        model.set_submodule(name, layer)


def _is_int8(module: nn.Module) -> bool:
    return isinstance(module, torch.ao.nn.quantized.dynamic.Linear)


def _param_name(model: nn.Module, param: torch.Tensor) -> str:
    return next(name for name, p in model.named_parameters(remove_duplicate=False) if p is param)


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: {name: {dtype, shape, data_offsets}}."""
    return stream.read_header(path)


def _read_weights(paths: list[Path], model: nn.Module, sinks: dict[str, Any] | None = None, mapped: set[str] = frozenset(),
                  extras: dict[str, torch.Tensor] | None = None,
                  places: dict[str, tuple[Path, int, tuple[int, ...]]] | None = None) -> set[str]:
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
            seen |= _read_file(path, targets, sinks, mapped, extras, packer, places)
        packer.wait()
    return {n for n in [*targets, *sinks] if n not in seen}


def _read_file(path: Path, targets: dict[str, torch.Tensor], sinks: dict[str, Any], mapped: set[str],
               extras: dict[str, torch.Tensor] | None, packer: "_Packer",
               places: dict[str, tuple[Path, int, tuple[int, ...]]] | None = None) -> set[str]:
    """_read_weights for one file; returns the names in its header (a mapped tensor's file, offset and shape go into
    `places`)."""
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
                if places is not None:
                    places[name] = (path, start + begin, tuple(entry["shape"]))
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
