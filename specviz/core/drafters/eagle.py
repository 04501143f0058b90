"""The EAGLE-style drafter: a chain guessed by a one-layer head from the target's own features (no second model).

After every verify pass the run hears the target's features at the kept positions (`Kept.hidden`), so
the head always knows the real feature of every position but the newest token's, which is exactly
what it needs: the pair (feature at M-2, token M-1) guesses token M. Its chain then feeds its own
guessed feature forward. Pairs with real features stay in its KV cache from round to round; the
guessed ones are dropped before the next round, which brings real features for what was kept.
The head is computed here, alone (one small layer); the target's passes are batched as every run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz.core.rounds import ChainDraftSession, Draft, Kept, Steps
from specviz.core.sampling import SamplingConfig, sample_from
from specviz.core.head import EagleHead

LAST_LAYER = -1  # transformers' hidden_states[-1]: the last layer's output after the final norm (what the target's head reads)


class _EagleSession(ChainDraftSession):
    features = (LAST_LAYER,)

    def __init__(self, head: EagleHead, sampling: SamplingConfig, vocab_size: int) -> None:
        if head.vocab.size != vocab_size:
            raise ValueError(f"this head drafts over a vocabulary of {head.vocab.size}, the target has {vocab_size}")
        self.head = head
        self.sampling = sampling
        self.cache = head.new_cache()
        self.real = 0  # pairs in the head's cache built from real features (positions 0..real-1)
        self.feats: list[torch.Tensor] = []  # the target's feature (d,) at each position heard so far

    def hear(self, kept: Kept) -> None:
        if not kept.hidden:
            return
        rows = kept.hidden[0]  # (rows, d) at positions kept.start...
        del self.feats[kept.start:]
        self.feats.extend(rows.unbind(0))

    @torch.inference_mode()
    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()  # no model pass: the head runs here
        last = len(ids) - 2  # the pair (feature at M-2, token M-1) guesses token M
        if gamma <= 0 or last < 0 or len(self.feats) <= last:
            return Draft((), torch.zeros(0, self.head.vocab.size))
        extra = self.cache.get_seq_length() - self.real
        if extra > 0:
            self.cache.crop(-extra)  # forget last round's guessed pairs (DynamicCache.crop takes a negative count)
        fresh = range(self.real, last + 1)  # real pairs not yet in the cache
        guessed = self.head(torch.stack([self.feats[i] for i in fresh]), torch.tensor([ids[i + 1] for i in fresh]),
                            torch.tensor(list(fresh)), self.cache)[-1:]  # (1, d): f̂ at M-1
        self.real = last + 1
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(gamma):
            q = self.head.vocab.q(self.head.logits(guessed)[0], self.sampling)  # (V,)
            x = int(q.argmax()) if self.sampling.greedy else sample_from(q, generator)
            tokens.append(x)
            rows.append(q)
            if step + 1 < gamma:  # the next pair: the guessed feature and the token just drafted
                guessed = self.head(guessed, torch.tensor([x]), torch.tensor([last + 1 + step]), self.cache)
        return Draft(tuple(tokens), torch.stack(rows))


@dataclass(frozen=True)
class EagleDrafter:
    """A one-layer head on the target's features drafts a chain of γ tokens over its reduced vocabulary."""

    head: EagleHead
    name: str = "eagle"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _EagleSession:
        return _EagleSession(self.head, sampling, vocab_size)
