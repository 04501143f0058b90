"""A draft's reduced vocabulary: the N most frequent target ids a cheap helper may propose (FR-Spec, EAGLE-3's `d2t`).

Why: a draft step that scores all 151,936 tokens streams the whole output head (136M of the Qwen 0.5B's
494M weights); scoring only the N tokens that make up almost all text costs a fraction of that. Why it
stays exact: the rule only needs q to be the distribution the draft token was drawn from. q is 0 outside
the N ids, so such a token is never proposed, and where the target wants one, the residual max(p - q, 0)
holds all of its probability: a rejection resamples it with exactly the mass the target gives it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.core.sampling import SamplingConfig, logits_to_probs


@dataclass(frozen=True, eq=False)
class DraftVocab:
    """The target ids a draft can propose, in ascending order; its rows of q are scattered back to the target's V."""

    ids: torch.Tensor  # (N,) int64, ascending, unique, each < size
    size: int  # the target's vocabulary V

    def __post_init__(self) -> None:
        ids = self.ids
        if ids.ndim != 1 or ids.dtype != torch.long or len(ids) == 0:
            raise ValueError("a draft vocabulary is a non-empty 1-D tensor of int64 ids")
        if bool((ids[1:] <= ids[:-1]).any()) or int(ids[0]) < 0 or int(ids[-1]) >= self.size:
            raise ValueError(f"a draft vocabulary's ids must be ascending, unique and in 0..{self.size - 1}")

    @property
    def n(self) -> int:
        return len(self.ids)

    def q(self, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """Logits over the N ids (..., N) -> q over the target's vocabulary (..., V), 0 outside the N ids.

        The sampling transform (temperature, top-k, top-p; greedy's one-hot) is applied over the N ids: that
        is the distribution the draft token is drawn from, so it is the q the rule must see.
        """
        small = logits_to_probs(logits, sampling)  # (..., N)
        full = torch.zeros(*small.shape[:-1], self.size, dtype=small.dtype, device=small.device)  # (..., V)
        return full.index_copy_(-1, self.ids.to(small.device), small)


def most_frequent(counts: torch.Tensor, n: int) -> DraftVocab:
    """The n ids with the highest counts (V,) (ties: the smaller id), as a DraftVocab over V = len(counts)."""
    size = len(counts)
    if not 1 <= n <= size:
        raise ValueError(f"a draft vocabulary needs between 1 and {size} tokens, not {n}")
    # a stable sort on -count keeps ascending ids among equal counts
    order = torch.sort(-counts.to(torch.float64), stable=True).indices[:n]
    return DraftVocab(torch.sort(order).values.to(torch.long), size)
