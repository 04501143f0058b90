"""Nested tensors on disk without pickle: tensors in one safetensors file, the rest of the structure as JSON beside them.

Recorded chunks and training checkpoints are read back by this process only, but a pickle is code, and
nothing the app reads from disk may run code (tests/test_trust.py). A tree of dicts, lists, tuples,
numbers, strings and tensors is split: every tensor goes into the safetensors file under a path-like key,
and the tree itself, with each tensor replaced by its key, goes into the file's JSON metadata. Tuples come
back as lists (JSON has no tuple), which the optimizer and scheduler states we store accept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_TENSOR = "__tensor__"
_INT_KEYS = "__int_keys__"  # optimizer states key their entries by parameter index


def _split(obj: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().contiguous().clone()  # clone: safetensors refuses tensors sharing storage
        return {_TENSOR: key}
    if isinstance(obj, dict):
        if obj and all(isinstance(k, int) for k in obj):
            return {_INT_KEYS: [[k, _split(v, f"{key}.{k}", tensors)] for k, v in obj.items()]}
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"{key}: only str or int keys can be stored")
        return {k: _split(v, f"{key}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_split(v, f"{key}.{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"{key}: a {type(obj).__name__} cannot be stored without pickle")


def _join(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            return tensors[obj[_TENSOR]]
        if set(obj) == {_INT_KEYS}:
            return {k: _join(v, tensors) for k, v in obj[_INT_KEYS]}
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join(v, tensors) for v in obj]
    return obj


def save_tree(path: Path, obj: Any) -> None:
    """Write `obj` to `path` whole or not at all (a temporary file, then a rename)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _split(obj, "t", tensors)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"tree": json.dumps(tree)})
    tmp.replace(path)


def load_tree(path: Path) -> Any:
    """Read back what `save_tree` wrote."""
    with safe_open(str(path), framework="pt") as f:
        tree = json.loads(f.metadata()["tree"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return _join(tree, tensors)
