"""The n-gram drafter (prompt lookup): copy what followed the same n-gram earlier in the text; no second model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz.core.drafters import Parts
from specviz.core.rounds import Session, Draft, Steps
from specviz.core.sampling import SamplingConfig


def find_ngram_continuation(ids: Sequence[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Up to k ids that followed the latest earlier occurrence of the longest matching suffix n-gram."""
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        suffix = list(ids[n_ids - n :])
        # scan right to left: the most recent match is most likely to continue the same way
        for start in range(n_ids - n - 1, -1, -1):
            if list(ids[start : start + n]) == suffix:
                follow = list(ids[start + n : start + n + k])
                if follow:
                    return follow
    return []


class _NgramSession(Session):
    def __init__(self, max_ngram: int, min_ngram: int, vocab_size: int) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.vocab_size = vocab_size

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()  # the lookup needs no pass
        tokens = find_ngram_continuation(ids, self.max_ngram, self.min_ngram, gamma)
        q = torch.zeros(len(tokens), self.vocab_size)  # (k, V) one-hot: the lookup is certain
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Draft(tuple(tokens), q)


@dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup: copy what followed the same n-gram earlier in the text (no second model)."""

    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "ngram"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _NgramSession:
        return _NgramSession(self.max_ngram, self.min_ngram, vocab_size)


def from_parts(parts: Parts) -> NgramDrafter:
    """The registry's "ngram" drafter (it needs neither model)."""
    return NgramDrafter()
