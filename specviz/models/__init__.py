"""Model pairs: the named registry and its sources (PyPI GGUF parts, hub ids or folders, a tiny pair built in code)."""

from specviz.models.base import PairError, LoadProgress
from specviz.models.gguf import cache_dir, ensure_cached
from specviz.models.registry import (
    DEFAULT_PAIR,
    PAIR_NAMES,
    PRECISIONS,
    LoadedPair,
    PairSpec,
    get_spec,
    load_pair,
)
from specviz.models.tiny import tiny_tokenizer

__all__ = [
    "DEFAULT_PAIR", "PAIR_NAMES", "PRECISIONS", "LoadedPair", "PairError", "PairSpec", "LoadProgress",
    "cache_dir", "ensure_cached", "get_spec", "load_pair", "tiny_tokenizer",
]
