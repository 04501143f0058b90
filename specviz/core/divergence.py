"""Where two greedy runs of one target first part, and (measured on demand) how close the target's top two tokens were there.

One meaning: the first position where the two token lists differ, a length difference counting
(a run cut short is not "identical"). It is what every identity claim reports. The gap fields are
filled by `with_gap`, which spends one more target pass on the text before that position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Divergence:
    """The first new-token position where two greedy runs of one target differ (plain CPU data)."""

    position: int  # index among the new tokens
    speculative_id: int | None  # what the speculative run kept there (None: it had ended)
    baseline_id: int | None  # what the target alone picked there (None: it had ended)
    # measured by with_gap (None until then, and where a run had ended):
    top_ids: tuple[int, int] | None = None  # the target's two best tokens there, from one fresh pass over the common prefix
    top2_gap: float | None = None  # logit(top 1) - logit(top 2) there: a tie the arithmetic of the pass shape can flip
    pair_gap: float | None = None  # |logit(baseline_id) - logit(speculative_id)| there, from the same fresh pass
    top_logit: float | None = None  # the best logit's value there (its size sets the rounding step of low precisions)


def first_divergence(speculative: Sequence[int], baseline: Sequence[int]) -> Divergence | None:
    """The first position where the token lists differ (a length difference counts), or None when they are equal."""
    for i, (a, b) in enumerate(zip(speculative, baseline)):
        if a != b:
            return Divergence(i, int(a), int(b))
    if len(speculative) == len(baseline):
        return None
    i = min(len(speculative), len(baseline))
    return Divergence(i, int(speculative[i]) if i < len(speculative) else None,
                      int(baseline[i]) if i < len(baseline) else None)


def with_gap(target: torch.nn.Module, prompt_ids: Sequence[int], d: Divergence, baseline: Sequence[int]) -> Divergence:
    """`d` with the target's top-2 gap there, from one extra target pass over prompt + the common prefix (no cache).

    A third pass shape: it shows how close the call was, not which of the two runs was "right".
    Where one run had already ended there is no pair of tokens to compare, and `d` comes back as it was.
    """
    if d.speculative_id is None or d.baseline_id is None:
        return d
    ids = torch.tensor([list(prompt_ids) + list(baseline[: d.position])], dtype=torch.long, device=target.device)  # (1, T)
    with torch.inference_mode():
        logits = target(input_ids=ids, logits_to_keep=1).logits[0, -1].float().cpu()  # (V,)
    top = torch.topk(logits, 2)
    return replace(
        d,
        top_ids=(int(top.indices[0]), int(top.indices[1])),
        top2_gap=float(top.values[0] - top.values[1]),
        pair_gap=abs(float(logits[d.baseline_id] - logits[d.speculative_id])),
        top_logit=float(top.values[0]),
    )


def divergence_with_gap(target: torch.nn.Module, prompt_ids: Sequence[int], speculative: Sequence[int],
                        baseline: Sequence[int]) -> Divergence | None:
    """`first_divergence`, and where both runs have a token there, the target's top-2 gap (`with_gap`)."""
    d = first_divergence(speculative, baseline)
    return None if d is None else with_gap(target, prompt_ids, d, baseline)
