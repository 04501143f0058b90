"""The model drafter: a small causal LM drafts a chain autoregressively with its own KV cache (or from a memo of q rows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from specviz.core import profile
from specviz.core.drafters import Parts
from specviz.core.kv import CachedLM
from specviz.core.rounds import Session, Draft, Steps
from specviz.core.sampling import SamplingConfig, draft_confidence, draft_q, sample_from


class QMemo(Protocol):
    """Rows of q already computed per prefix (a lab drawing thousands of samples of one prompt reuses them)."""

    sampling: SamplingConfig  # the settings its rows were made with (the seed aside: it changes no row)

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]: ...  # (n_last, V) q rows, draft_q applied


class _ModelDraftSession(Session):
    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, vocab_size: int,
                 min_confidence: float, min_tokens: int, memo: QMemo | None) -> None:
        self.lm = CachedLM(model) if memo is None else None  # a memo brings its own cache
        self.memo = memo
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.min_confidence = min_confidence
        self.min_tokens = min_tokens

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        if self.lm is not None:  # a memo brings its own cache
            yield from self.lm.prefill_steps(ids)

    def _q(self, seq: Sequence[int]) -> Steps[tuple[torch.Tensor, torch.Tensor | None]]:
        """q at the end of seq (V,), and the raw logits when computed here (None from a memo)."""
        if self.memo is not None:
            return (yield from self.memo.probs(seq, 1))[0], None
        logits = (yield self.lm.feed(seq, 1)).logits[0]  # type: ignore[union-attr]  # (V_draft,)
        laps = profile.laps()
        laps.mark()
        q = draft_q(logits, self.sampling, self.vocab_size)
        laps("q (softmax) and sampling", role="draft")
        return q, logits

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        seq = list(ids)
        rows: list[torch.Tensor] = []
        for _ in range(gamma):
            q, logits = yield from self._q(seq)  # (V,)
            laps = profile.laps()
            laps.mark()
            x = int(q.argmax()) if self.sampling.greedy else sample_from(q, generator)
            laps("q (softmax) and sampling", role="draft")
            rows.append(q)
            seq.append(x)
            # like transformers' assistant_confidence_threshold: an unsure draft stops after this token,
            # since the tokens after it would most likely be rejected anyway
            unsure = (self.min_confidence and logits is not None
                      and draft_confidence(q, x, self.sampling, logits, x) < self.min_confidence)
            if unsure and len(rows) >= self.min_tokens:
                break
        q_all = torch.stack(rows) if rows else torch.zeros(0, self.vocab_size)  # (k, V)
        return Draft(tuple(seq[len(ids):]), q_all)


@dataclass(frozen=True)
class ModelDrafter:
    """A small causal LM drafts autoregressively with its own per-request KV cache (or from a memo of q)."""

    model: torch.nn.Module
    min_confidence: float = 0.0  # stop drafting after a token the draft itself rates below this (0 = never)
    min_tokens: int = 1  # ...but never before this many tokens (short verify passes can cost more: README, "Why these defaults")
    name: str = "model"
    q_memo: QMemo | None = None  # rows of q per prefix, shared by many requests of one prompt (the Same answer lab)

    def __post_init__(self) -> None:
        if self.q_memo is not None and self.min_confidence:
            raise ValueError("a q memo keeps no logits: the confidence stop needs min_confidence = 0")

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _ModelDraftSession:
        if self.q_memo is not None and replace(self.q_memo.sampling, seed=sampling.seed) != sampling:
            raise ValueError("this drafter's q memo was built for other sampling settings")
        return _ModelDraftSession(self.model, sampling, vocab_size, self.min_confidence, self.min_tokens, self.q_memo)


# the confidence stop of adaptive runs, as transformers' assistant_confidence_threshold (measured: README, "Why these defaults")
ADAPTIVE_MIN_CONFIDENCE = 0.4
ADAPTIVE_MIN_TOKENS = 1


def from_parts(parts: Parts) -> ModelDrafter:
    """The registry's "model" drafter: the pair's draft model, with the confidence stop when adaptive."""
    if parts.draft is None:
        raise ValueError("the model drafter needs a draft model")
    if parts.q_memo is not None:
        return ModelDrafter(parts.draft, q_memo=parts.q_memo)  # a memo keeps no logits: no confidence stop
    if not parts.adaptive:
        return ModelDrafter(parts.draft)
    return ModelDrafter(parts.draft, min_confidence=ADAPTIVE_MIN_CONFIDENCE, min_tokens=ADAPTIVE_MIN_TOKENS)
