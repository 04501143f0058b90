"""Model pairs: the named registry and its sources (PyPI GGUF parts, hub ids or folders, a tiny pair built in code)."""

from specviz.models.base import PairError, LoadProgress
from specviz.models.cache import ensure_cached
from specviz.models.locate import cache_dir
from specviz.models.registry import (
    DEFAULT_PAIR,
    PAIR_NAMES,
    LoadedPair,
    PairSpec,
    build_ahead,
    choose_precisions,
    get_spec,
    load_pair,
    memory_estimate,
    pair_ref,
    split_ref,
)
from specviz.models.precision import BIT_EXACT
from specviz.models.tiny import tiny_tokenizer

__all__ = [
    "DEFAULT_PAIR", "PAIR_NAMES", "LoadedPair", "PairError", "PairSpec", "LoadProgress",
    "cache_dir", "ensure_cached", "get_spec", "load_pair", "tiny_tokenizer",
    "BIT_EXACT", "build_ahead", "choose_precisions", "memory_estimate", "pair_ref", "split_ref",
]
