"""Weights one tensor at a time: read from GGUF or safetensors, brought to a cache form, written in shards, read back and checked."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch
from torch import nn

from specviz.models import half
from specviz.models.base import PairError
from specviz.models.precision import int8_linears

# How a cache folder stores a model: as the load uses it, so that the cache is the size of what is used.
#   fp32:  every tensor in fp32 (fp32, bf16 and int8 targets, and drafts in fp32 or bf16, start from it)
#   fp16w: the linears' weights in fp16 (what models.half packs: the same values), the rest fp32 (an fp16w target)
#   int8:  the int8 layers' per-channel int8 weights with their scales and zero points, the rest fp32 (an int8 draft)
Form = Literal["fp32", "fp16w", "int8", "gguf"]
Tensors = Iterator[tuple[str, torch.Tensor]]  # (Hugging Face name, fp32 tensor), one at a time
INT8_PARTS = (".weight.int8", ".weight.scales", ".weight.zero_points")  # names of one int8 layer's weight in a cache file
DEQUANT_VALUES = 1 << 22  # values dequantized in one call (16 MB of fp32 output)
SHARD_BYTES = 256 << 20  # a shard is written once this much is waiting: the build holds about one shard at a time
DTYPES = {"F32": torch.float32, "F16": torch.float16, "I8": torch.int8, "F64": torch.float64, "I64": torch.int64}


# ----------------------------------------------------------------------------------------------
# Sources: a GGUF file, a safetensors file, a model in memory
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def one_gguf_reader(path: Path) -> Iterator[None]:
    """While open, the metadata of `path` is parsed once however often transformers asks for it.

    Three things, each a pure function of its arguments, are computed once and shared:
    - the GGUFReader of `path` (transformers makes one for the config, two for the tokenizer, one for the
      tensors' names): a reader parses every metadata field on construction, and the tokenizer's 151,936
      tokens and merges took about 12 s each time (4 readers: 49 of the Qwen 0.5B's 99 s build). The shared
      one reads a plain array view of the file's map (_plain_map_reader): 12.6 -> 4.1 s for the 1.5B's;
    - load_gguf_checkpoint's metadata-only answer (config and tokenizer fields as Python values; each caller
      gets its own deep copy, since transformers' callers and ours edit it);
    - gguf's TensorNameMap of an architecture: get_gguf_hf_weights_map builds a new one at each of the ~400
      modules it recurses into (6-10 s of formatted names per build).
    transformers imports these from their modules at each call, so swapping the modules' attributes is
    enough; the build runs in a child process of its own, so nothing else sees the swap, and it is undone on exit.
    """
    import gguf
    from transformers import modeling_gguf_pytorch_utils as hf_gguf

    real_reader, real_checkpoint, real_name_map = gguf.GGUFReader, hf_gguf.load_gguf_checkpoint, gguf.get_tensor_name_map
    shared: dict[Any, Any] = {}

    def ours(where: Any) -> bool:
        return isinstance(where, (str, os.PathLike)) and Path(where).resolve() == path.resolve()

    def reader(where: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not ours(where):
            return real_reader(where, *args, **kwargs)
        if "reader" not in shared:
            shared["reader"] = _plain_map_reader(real_reader)(where)
        return shared["reader"]

    def checkpoint(where: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        if return_tensors or args or kwargs or not ours(where):
            return real_checkpoint(where, return_tensors, *args, **kwargs)
        if "metadata" not in shared:
            shared["metadata"] = real_checkpoint(where, return_tensors=False)
        return _fresh_copy(shared["metadata"])

    def name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in shared:  # read only by its callers (get_name, get_type)
            shared[arch, n_blocks] = real_name_map(arch, n_blocks)
        return shared[arch, n_blocks]

    gguf.GGUFReader, hf_gguf.load_gguf_checkpoint, gguf.get_tensor_name_map = reader, checkpoint, name_map  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, hf_gguf.load_gguf_checkpoint, gguf.get_tensor_name_map = real_reader, real_checkpoint, real_name_map  # type: ignore[misc]


_ATOMS = (str, bytes, int, float, bool, type(None))


def _fresh_copy(value: Any) -> Any:
    """copy.deepcopy of parsed GGUF metadata, with lists of plain values copied in one call.

    The tokenizer's lists hold 151,936 strings each (tokens, merges, types): deepcopy visits every one and took
    ~1.3 s a copy, three copies a build; plain values are immutable, so a shallow copy of such a list is as deep."""
    if type(value) is dict:  # exactly dict and list: a subclass keeps its type through deepcopy below
        return {k: _fresh_copy(v) for k, v in value.items()}
    if type(value) is list:
        if all(type(v) in _ATOMS for v in value):
            return list(value)
        return [_fresh_copy(v) for v in value]
    if type(value) in _ATOMS:
        return value
    return copy.deepcopy(value)


def _plain_map_reader(base: type) -> type:
    """gguf's reader class, made to parse through a plain ndarray view of its file's map.

    The reader slices its np.memmap once for every field part (455,285 slices for a Qwen tokenizer), and each
    slice of a memmap runs numpy's Python-level memmap.__getitem__ and __array_finalize__; a plain view of the
    same mapped bytes slices in C. The same fields and tensors come out (checked on both packaged GGUFs), and
    the map stays open as the view's base. Only its `data` attribute differs: set to the map, read as the view.
    """

    class PlainMapReader(base):  # type: ignore[misc,valid-type]
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._map, self._plain = mapped, mapped.view(np.ndarray)

    return PlainMapReader


def gguf_config(path: Path) -> Any:
    """The transformers config of a GGUF file, from its metadata alone (no tensor is read)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the cache holds plain tensors; a reload must not ask for a GGUF file
    return config


def gguf_tensors(path: Path, config: Any) -> tuple[int, Tensors]:
    """How many tensors a GGUF file has, and an iterator over them dequantized to fp32 under their transformers names.

    The same steps as transformers' GGUF loader (gguf's dequantize, the architecture's tensor processor,
    the GGUF -> transformers name map), but one tensor at a time instead of a whole fp32 state dict:
    the 1.5B target's fp32 copy (7 GB) is never in memory.
    """
    import gguf
    from gguf import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint, read_field)

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)  # metadata: what the processor reads (heads, ...)
    for key in [k for k in parsed if k != "config"]:
        parsed[key] = {}  # the tokenizer's 151,936 tokens and merges as Python objects: not needed here
    reader = gguf.GGUFReader(str(path))  # the shared one inside one_gguf_reader
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    names = get_gguf_hf_weights_map(skeleton, processor)

    def tensors() -> Tensors:
        for tensor in reader.tensors:
            weights = _dequantize_rows(dequantize, tensor.data, tensor.tensor_type)
            result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=names,
                                       parsed_parameters=parsed)
            if result.name in names:  # a fresh fp32 array (a view of the mapped file is copied)
                yield names[result.name], torch.from_numpy(np.require(result.weights, np.float32, ["C", "W", "O"]))

    return len(reader.tensors), tensors()


def _dequantize_rows(dequantize: Callable[[np.ndarray, Any], np.ndarray], data: np.ndarray, qtype: Any) -> np.ndarray:
    """gguf's dequantize, a block of rows at a time into one fp32 array.

    Its numpy kernels make several temporaries the size of their output (the Qwen 1.5B embedding,
    233M values, peaked at 7 GB in one call); blocks of rows give the same values (each GGUF block
    lies in one row) with temporaries of DEQUANT_VALUES at most.
    """
    if data.ndim < 2 or data.shape[0] < 2:
        return dequantize(data, qtype)
    first = dequantize(data[:1], qtype)
    step = max(1, DEQUANT_VALUES // first.size)
    if step >= data.shape[0]:
        return dequantize(data, qtype)
    out = np.empty((data.shape[0], *first.shape[1:]), dtype=np.float32)
    for i in range(0, data.shape[0], step):
        out[i : i + step] = dequantize(data[i : i + step], qtype)
    return out


def file_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a safetensors file, read one at a time with plain reads (no mapping: nothing counted twice)."""
    with open(path, "rb") as fh:
        header, start = header_of(fh)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            yield name, read_tensor(fh, start, name, entry, path)


def model_tensors(model: nn.Module) -> Tensors:
    """A model's parameters (tied ones once) and persistent buffers in fp32, as a source like a file's."""
    for name, param in model.named_parameters():
        yield name, param.detach().float()
    for prefix, module in model.named_modules():
        for bname, buf in module._buffers.items():
            if buf is not None and bname not in module._non_persistent_buffers_set:
                yield (f"{prefix}.{bname}" if prefix else bname), buf.float()


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: {name: {dtype, shape, data_offsets}}."""
    with open(path, "rb") as fh:
        return header_of(fh)[0]


def header_of(fh: Any) -> tuple[dict[str, Any], int]:
    """The header of a safetensors file open at its start, and where its data begins."""
    length = int.from_bytes(fh.read(8), "little")
    return json.loads(fh.read(length)), 8 + length


def read_tensor(fh: Any, start: int, name: str, entry: dict[str, Any], path: Path) -> torch.Tensor:
    """One tensor of an open safetensors file, read into fresh memory."""
    dtype = DTYPES.get(entry["dtype"])
    if dtype is None:
        raise PairError(f"unexpected {entry['dtype']} tensor {name} in {path}; delete the cache folder to rebuild it")
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise PairError(f"{path}: tensor {name} has the wrong size; delete the cache folder to rebuild it")
    raw = torch.empty(shape, dtype=dtype)
    fh.seek(start + begin)
    fh.readinto(memoryview(raw.view(-1).view(torch.uint8).numpy()))
    return raw


# ----------------------------------------------------------------------------------------------
# A tensor in its form: what a load in that precision makes of it, computed by the load's own calls
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Which names are linear layers' weights in a model, and what the form does with them."""

    form: Form
    linears: frozenset[str]  # module names of the nn.Linears
    int8: frozenset[str]  # module names int8 quantization covers (down projections stay fp32)
    embedding: str  # the input embedding's weight name
    tied_head: str | None  # the output head's module name where it is tied to the embedding


def layout(config: Any, form: Form) -> Layout:
    """The layout of the model `config` describes (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    names = {id(m): n for n, m in skeleton.named_modules()}
    embedding = f"{names[id(skeleton.get_input_embeddings())]}.weight"
    head = skeleton.get_output_embeddings()
    tied = bool(getattr(config, "tie_word_embeddings", False)) and head is not None
    linears = frozenset(n for n, m in skeleton.named_modules() if isinstance(m, nn.Linear))
    return Layout(form, linears, frozenset(int8_linears(skeleton)), embedding, names[id(head)] if tied else None)


def stored_as(lay: Layout, name: str, tensor: torch.Tensor,
              made: dict[str, nn.Module] | None = None) -> dict[str, torch.Tensor]:
    """The tensors a cache of `lay.form` stores for one fp32 tensor (a tied int8 head comes with the embedding).

    The int8 layers it makes go into `made` (module name -> layer), for the check to compare against.
    """
    module, _, kind = name.rpartition(".")
    out: dict[str, torch.Tensor] = {}
    made = {} if made is None else made
    if kind == "weight" and lay.form == "fp16w" and module in lay.linears and module != lay.tied_head:
        out[name] = half.fp16_values(tensor)  # the fp16 values fbgemm's packing holds, exactly
    elif kind == "weight" and lay.form == "int8" and module in lay.int8:
        made[module] = int8_layer(tensor)
        out.update(int8_parts(module, made[module]))
    elif not (module == lay.tied_head and kind == "weight"):
        out[name] = tensor.contiguous()
    if name == lay.embedding and lay.form == "int8" and lay.tied_head in lay.int8:
        made[lay.tied_head] = int8_layer(tensor)  # the head's own int8 copy, as quantize_int8 makes it
        out.update(int8_parts(lay.tied_head, made[lay.tied_head]))
    return out


def int8_layer(weight: torch.Tensor) -> nn.Module:
    """The layer an int8 load makes of this weight: quantize_dynamic's per-channel from_float, the same call."""
    from torch.ao.quantization import per_channel_dynamic_qconfig

    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")  # no random init to overwrite
    linear.weight = nn.Parameter(weight, requires_grad=False)  # read, never written, by from_float
    linear.qconfig = per_channel_dynamic_qconfig
    with warnings.catch_warnings(), torch.no_grad():  # torch.ao.quantization is deprecated but still the tool for this
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        return torch.ao.nn.quantized.dynamic.Linear.from_float(linear)


def int8_parts(module: str, layer: nn.Module) -> dict[str, torch.Tensor]:
    """An int8 layer's weight as three plain tensors (int8 values, per-row scales and zero points)."""
    weight, _ = layer._weight_bias()
    if weight.qscheme() != torch.per_channel_affine or weight.q_per_channel_axis() != 0:
        raise PairError(f"{module}: only per-channel int8 weights (axis 0) can be cached")
    parts = (weight.int_repr(), weight.q_per_channel_scales(), weight.q_per_channel_zero_points())
    return {module + p: t.contiguous() for p, t in zip(INT8_PARTS, parts)}


def int8_from_parts(ints: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """The dynamic int8 layer of a stored weight: the layer quantize_int8 made, bit for bit."""
    weight = torch._make_per_channel_quantized_tensor(ints, scales, zeros, 0)
    # made 1x1, then given its shape: the constructor packs a zero weight of the full shape that set_weight_bias
    # replaces at once (17 ms for the 0.5B's 4864x896 layers: 145 of them at every load of the draft)
    layer = torch.ao.nn.quantized.dynamic.Linear(1, 1, dtype=torch.qint8)
    layer.in_features, layer.out_features = ints.shape[1], ints.shape[0]
    layer.set_weight_bias(weight, bias)
    return layer


# ----------------------------------------------------------------------------------------------
# Writing: shards of at most SHARD_BYTES, each read back and checked against what it should hold
# ----------------------------------------------------------------------------------------------


def write_shards(tensors: Tensors, lay: Layout, folder: Path, count: int,
                 report: Callable[[float, str], None]) -> int:
    """Write every tensor in its form into model-NNNNN.safetensors files; returns how many linears were checked.

    Two checks, and a cache that fails one is refused, not used: every linear's stored form, rebuilt as a
    load rebuilds it, gives the same layer as the one its precision makes from the dequantized tensor
    (fp16w: each value a nearest fp16 of the dequantized one; int8: the same outputs on a fixed input), checked as each tensor
    is converted; and every shard, once written, reads back from disk bit for bit.
    """
    pending: dict[str, torch.Tensor] = {}
    shard, checked, size = 0, 0, 0
    for i, (name, tensor) in enumerate(tensors, start=1):
        made: dict[str, nn.Module] = {}
        stored = stored_as(lay, name, tensor, made)
        checked += _check_layers(lay, name, tensor, stored, made)
        del tensor  # only its stored form is held from here on
        pending.update(stored)
        size += sum(t.numel() * t.element_size() for t in stored.values())
        if size >= SHARD_BYTES:
            shard += 1
            _flush(pending, folder / f"model-{shard:05d}.safetensors")
            pending, size = {}, 0
        report(i / max(count, 1), f"writing {lay.form} tensors ({i}/{count})")
    if pending:
        shard += 1
        _flush(pending, folder / f"model-{shard:05d}.safetensors")
    _name_as_transformers_does(folder, shard)
    return checked


def _name_as_transformers_does(folder: Path, shards: int) -> None:
    """Rename the shards model-0000i-of-0000n.safetensors and write their index, so that transformers' own
    from_pretrained reads the folder too (as it read the one file of older caches)."""
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(1, shards + 1):
        final = f"model-{i:05d}-of-{shards:05d}.safetensors"
        os.replace(folder / f"model-{i:05d}.safetensors", folder / final)
        for name, entry in read_header(folder / final).items():
            if name != "__metadata__":
                weight_map[name] = final
                total += entry["data_offsets"][1] - entry["data_offsets"][0]
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def _check_layers(lay: Layout, name: str, tensor: torch.Tensor, stored: dict[str, torch.Tensor],
                  made: dict[str, nn.Module] | None = None) -> int:
    """Check the linears whose stored form differs from the fp32 tensor; returns how many.

    `made` holds the int8 layers stored_as made of this tensor (the layer its precision makes, made once)."""
    converted = {n[: -len(INT8_PARTS[0])] for n in stored if n.endswith(INT8_PARTS[0])}
    if name in stored and stored[name].dtype == torch.float16:
        converted.add(name[: -len(".weight")])
    for module in converted:
        _check_layer(module, tensor, stored, (made or {}).get(module))
    return len(converted)


def _check_layer(module: str, weight: torch.Tensor, stored: dict[str, torch.Tensor], made: nn.Module | None = None) -> None:
    """The layer rebuilt from its stored form equals the layer its precision makes from the dequantized weight."""
    if f"{module}.weight" in stored:  # fp16w: fbgemm's fp16 values, each a nearest fp16 of the dequantized weight
        same = half.is_nearest_fp16(stored[f"{module}.weight"], weight)
    else:  # int8: the outputs on a fixed input
        x = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
        rebuilt = int8_from_parts(*(stored[module + p] for p in INT8_PARTS), None)
        with torch.no_grad():
            same = torch.equal(rebuilt(x), (made if made is not None else int8_layer(weight))(x))
    if not same:
        raise PairError(f"{module}: the cached layer differs from the one its precision makes; not cached")


def _flush(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Save one shard, then read it back one tensor at a time: each must come back bit for bit."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)  # as save_pretrained leaves its files: readable by the app's other users
    names = set()
    for name, back in file_tensors(path):
        names.add(name)
        if name not in tensors or not _same_bits(back, tensors[name]):
            raise PairError(f"{path.name}: {name} did not read back as written; not cached")
    if names != tensors.keys():
        raise PairError(f"{path.name} lacks {sorted(tensors.keys() - names)[:3]}; not cached")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))


def shard_files(folder: Path) -> list[Path]:
    """A cache folder's weight files in order (one model.safetensors in caches of older specviz)."""
    return sorted(folder.glob("model*.safetensors"))
