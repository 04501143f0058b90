"""One request's KV cache over a shared, read-only causal LM: feed only unseen ids, crop on rollback."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class CachedLM:
    """A per-request KV cache in front of a model that many requests share.

    The cache always holds the keys/values of `self.ids`. Asking for logits of a new
    sequence crops the cache back to the common prefix (this is the rollback after a
    rejected draft) and feeds only the rest, so callers never manage cache lengths.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = getattr(model, "device", torch.device("cpu"))  # HF models expose .device
        self.cache = DynamicCache(config=model.config)
        self.ids: list[int] = []  # ids whose keys/values are in the cache

    def crop(self, length: int) -> None:
        """Forget every cached position from `length` on (DynamicCache.crop takes a negative count)."""
        extra = len(self.ids) - length
        if extra > 0:
            self.cache.crop(-extra)
            del self.ids[length:]

    @torch.inference_mode()
    def logits(self, ids: Sequence[int], n_last: int) -> torch.Tensor:
        """Logits (n_last, V) of the last n_last positions of `ids`, reusing the cache."""
        keep = min(common_prefix_len(self.ids, ids), len(ids) - n_last)
        self.crop(keep)
        feed = torch.tensor([list(ids[keep:])], dtype=torch.long, device=self.device)  # (1, m)
        out = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=n_last)
        self.ids.extend(ids[keep:])
        return out.logits[0, -n_last:].float()  # (n_last, V)

    def prefill(self, ids: Sequence[int]) -> None:
        """Fill the cache with every id but the last, which the first step feeds itself."""
        if len(ids) > 1:
            self.logits(list(ids[:-1]), 1)
