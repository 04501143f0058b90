"""Where a speculative run first left the target's own greedy text, and how close the target's top two tokens were there."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz.core.kv import common_prefix_len


@dataclass(frozen=True)
class Divergence:
    """The first new-token position where two greedy runs of one target differ (plain CPU data)."""

    position: int  # index among the new tokens
    speculative_id: int  # what the speculative run kept there
    baseline_id: int  # what the target alone picked there
    top_ids: tuple[int, int]  # the target's two best tokens there, from one fresh pass over the common prefix
    top2_gap: float  # logit(top 1) - logit(top 2) there: a tie the arithmetic of the pass shape can flip
    pair_gap: float  # |logit(baseline_id) - logit(speculative_id)| there, from the same fresh pass


def first_divergence(
    target: torch.nn.Module, prompt_ids: Sequence[int], speculative: Sequence[int], baseline: Sequence[int]
) -> Divergence | None:
    """None when the runs agree (one a prefix of the other counts as agreeing); else the first divergence.

    The gap is measured with one extra target pass over prompt + the common prefix (no cache): a third
    pass shape, so it shows how close the call was, not which of the two runs was "right".
    """
    j = common_prefix_len(speculative, baseline)
    if j >= min(len(speculative), len(baseline)):
        return None
    ids = torch.tensor([list(prompt_ids) + list(baseline[:j])], dtype=torch.long, device=target.device)  # (1, T)
    with torch.inference_mode():
        logits = target(input_ids=ids, logits_to_keep=1).logits[0, -1].float().cpu()  # (V,)
    top = torch.topk(logits, 2)
    s_id, b_id = int(speculative[j]), int(baseline[j])
    return Divergence(
        position=j,
        speculative_id=s_id,
        baseline_id=b_id,
        top_ids=(int(top.indices[0]), int(top.indices[1])),
        top2_gap=float(top.values[0] - top.values[1]),
        pair_gap=abs(float(logits[b_id] - logits[s_id])),
    )
