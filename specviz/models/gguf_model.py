"""A transformers model whose linears and embedding run on its GGUF file's own blocks (models.blocks), from the gguf cache form.

The form is a folder: the verified GGUF file itself, its config and tokenizer as transformers saves them, and a
table of its tensors (name, type, shape, where its bytes are). A load maps the file and builds the model around
views of it: nothing is dequantized or copied, so a load takes seconds and holds only the pages a pass touches.
The table spares each load gguf's reader, which parses the whole vocabulary (7 s for the Qwen files).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specviz.core import attend, lean
from specviz.models import blocks
from specviz.models.base import PairError

GGUF_FILE = "model.gguf"
TABLE = "tensors.json"
_FLOAT = {0: np.float32, 1: np.float16}  # ggml's F32 and F16: norms, biases (and plain linears of some files)


def tensor_table(path: Path) -> dict[str, Any]:
    """The file's tensors as {name: {type, shape (rows first, as torch), offset, nbytes}} and its architecture."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    table = {t.name: {"type": int(t.tensor_type), "shape": [int(n) for n in reversed(t.shape.tolist())],
                      "offset": int(t.data_offset), "nbytes": int(t.n_bytes)} for t in reader.tensors}
    return {"architecture": arch, "tensors": table}


def write_table(path: Path, out: Path) -> None:
    out.write_text(json.dumps(tensor_table(path)))


def load_model(folder: Path, title: str, kernel: blocks.BlockKernel, draft: bool = False) -> nn.Module:
    """The model of a gguf cache folder, eval mode, its quantized tensors views of the mapped file; a `draft`'s linears
    of more than 4.5 bits a weight are read as Q4_0 (`requantized`)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    from specviz.models.cached import _rebuild_buffers

    config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    info = json.loads((folder / TABLE).read_text())
    mapped = np.memmap(folder / GGUF_FILE, dtype=np.uint8, mode="r")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    processor = TENSOR_PROCESSORS.get(info["architecture"], TensorProcessor)(config=config.to_dict())
    _memoize_name_maps()
    names = get_gguf_hf_weights_map(model, processor)
    quantized: dict[str, tuple[torch.Tensor, int, int]] = {}  # module name -> (blocks, type, in_features)
    plain: dict[str, torch.Tensor] = {}  # parameter name -> fp32 tensor
    for name, entry in info["tensors"].items():
        data = mapped[entry["offset"] : entry["offset"] + entry["nbytes"]]
        qtype, shape = entry["type"], entry["shape"]
        if qtype in _FLOAT:
            data = data.view(_FLOAT[qtype]).reshape(shape)
        elif qtype in blocks.TYPE_NAMES:
            data = data.reshape(shape[0], -1)  # (rows, bytes a row): rows of whole blocks
        else:
            raise PairError(f"{title}: tensor {name} is of a GGUF type blockgemm does not read ({qtype})")
        # the architecture's own reordering (Llama's q/k rows), on the rows as stored
        result = processor.process(weights=data, name=name, tensor_key_mapping=names, parsed_parameters={})
        target = names.get(result.name)
        if target is None:
            continue
        if qtype in _FLOAT:
            plain[target] = torch.from_numpy(np.array(result.weights, dtype=np.float32))
        else:
            quantized[target.removesuffix(".weight")] = (blocks.blocks_from_numpy(np.ascontiguousarray(result.weights)),
                                                        qtype, shape[1])
    if draft:
        quantized = requantized(quantized, kernel, model)
    _place(model, quantized, plain, kernel, config, title, lambda: _let_go_of_read_pages(mapped))
    if draft:  # the Q4_0 copies live in the side-by-side form alone (nothing reads a draft's rows)
        for module in model.modules():
            if isinstance(module, blocks.BlockLinear) and module.qtype == blocks.TYPES["Q4_0"]:
                module.forget_blocks()
    _rebuild_buffers(model, config)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise PairError(f"{title}: the GGUF file lacks {len(left)} tensors the model needs (first: {left[0]})")
    blocks.fuse(model)  # q/k/v and gate/up of one type: one kernel call each (core.lean)
    attend.mark(model, kernel)  # its activations are quantized: each attention row alone, as a one-token step
    # would compute it (core.attend), all rows in one call of the kernel's attention
    model.gguf_file = str(folder / GGUF_FILE)  # for the record (what the page and the bench name)
    setattr(model, lean.GLUE, kernel)  # norms, rotary and the gate as one kernel call each (core.lean)
    return model.eval()


def _memoize_name_maps() -> None:
    """gguf's TensorNameMap of an architecture built once per process: get_gguf_hf_weights_map builds a new one at each
    of the ~700 modules it recurses into (5-12 s of a load, mostly formatted names). The map is a pure function of
    (architecture, blocks) and its callers only read it, so every caller in the process may share one: installed once,
    never undone (unlike stream.one_gguf_reader's swap of the reader, which only a build's child process sees)."""
    import gguf

    if not getattr(gguf.get_tensor_name_map, "specviz_memo", False):
        memo = functools.lru_cache(maxsize=16)(gguf.get_tensor_name_map)
        memo.specviz_memo = True  # type: ignore[attr-defined]
        gguf.get_tensor_name_map = memo  # transformers imports it from the module at each call


def requantized(quantized: dict[str, tuple[torch.Tensor, int, int]], kernel: blocks.BlockKernel,
                model: nn.Module) -> dict[str, tuple[torch.Tensor, int, int]]:
    """A draft's linears (its output layer too, tied or not) of more than 4.5 bits a weight as Q4_0, gguf's own
    quantization of their floats (blockgemm_rows.h). Why: a draft step reads every byte of its linears, and a draft's
    bits change only how often it guesses right, never the output (the target checks every token). The Qwen 0.5B's
    Q5_0 / Q8_0 / Q6_K linears: 424 MB a step become 234 MB; about 2 s at each load (kept out of the cache: it stays
    one file per model). The embedding keeps its file's blocks: a step reads one row of it."""
    embedding = model.get_input_embeddings()
    head_name = next(n for n, m in model.named_modules() if m is model.get_output_embeddings())
    modules = dict(model.named_modules())
    out = dict(quantized)
    if head_name not in out:  # tied: the head reads the embedding's rows, as its own Q4_0 copy
        emb_name = next(n for n, m in modules.items() if m is embedding)
        if emb_name in quantized:
            out[head_name] = quantized[emb_name]
    for name, (data, qtype, k) in out.items():
        if modules.get(name) is not embedding and qtype not in _NARROW and k % 32 == 0:
            out[name] = (kernel.requantize_q4_0(qtype, data, k), blocks.TYPES["Q4_0"], k)
    return out


_NARROW = (blocks.TYPES["Q4_0"], blocks.TYPES["Q4_K"])  # 4.5 bits a weight: a draft reads these as they are


def _place(model: nn.Module, quantized: dict[str, tuple[torch.Tensor, int, int]], plain: dict[str, torch.Tensor],
           kernel: blocks.BlockKernel, config: Any, title: str, read: Any = lambda: None) -> None:
    """Put each tensor where it goes: quantized linears and embeddings as block modules, the rest as parameters.
    `read()` after each linear: the file's pages it was repacked from may go (the load's peak stays near one copy)."""
    modules = dict(model.named_modules())
    embedding = model.get_input_embeddings()
    head_name = next(n for n, m in modules.items() if m is model.get_output_embeddings())
    for name, (data, qtype, k) in quantized.items():
        module = modules.get(name)
        if module is embedding:
            _set_module(model, name, blocks.BlockEmbedding(data, qtype, k, kernel))
        elif isinstance(module, nn.Linear):
            bias = plain.pop(f"{name}.bias", None)
            _set_module(model, name, blocks.BlockLinear(data, qtype, k, bias, kernel))
            read()
        else:
            raise PairError(f"{title}: a quantized tensor for {name}, which is no linear or embedding")
    if head_name not in quantized:  # tied to the embedding (or the file stores none): the embedding's own blocks
        emb = model.get_input_embeddings()
        if not isinstance(emb, blocks.BlockEmbedding):
            raise PairError(f"{title}: no output layer in the file, and an embedding that is not quantized")
        _set_module(model, head_name, blocks.BlockLinear(emb.blocks, emb.qtype, emb.embedding_dim, None, kernel))
        read()
    for name, tensor in plain.items():
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(module, nn.Linear) and attr == "weight":  # a linear the file keeps in floats
            module.weight = nn.Parameter(tensor, requires_grad=False)
        else:
            setattr(module, attr, nn.Parameter(tensor, requires_grad=False))
    for name, module in list(model.named_modules()):  # float linears still without a bias tensor: none in the file
        if isinstance(module, nn.Linear) and module.bias is not None and module.bias.is_meta:
            module.bias = None


def _let_go_of_read_pages(mapped: np.memmap) -> None:
    """The repacking read the file's pages; they leave this process's memory (the page cache keeps them), so that what
    a pass reads, the repacked copies and the rows still used in place, is all that stays resident."""
    import mmap

    raw = getattr(mapped, "_mmap", None)
    if raw is not None and hasattr(mmap, "MADV_DONTNEED"):
        raw.madvise(mmap.MADV_DONTNEED)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner) if owner else model, attr, module)
