"""Drafters: propose up to γ tokens and the full q distribution each was drawn from (chains), or a tree; `make_drafter` picks one by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from specviz.core.kv import CachedLM
from specviz.core.limits import DRAFTER_KINDS
from specviz.core.rounds import Draft, Drafter, Round, RunTools, Steps, chain_round, solo
from specviz.core.sampling import SamplingConfig, draft_q, sample_from
from specviz.core.trace import RoundTrace
from specviz.core.tree import TreeConfig, TreeDrafter

__all__ = ["ChainDraftSession", "Draft", "Drafter", "ModelDrafter", "NgramDrafter", "find_ngram_continuation", "make_drafter"]


class QMemo(Protocol):
    """Rows of q already computed per prefix (a lab drawing thousands of samples of one prompt reuses them)."""

    sampling: SamplingConfig  # the settings its rows were made with (the seed aside: it changes no row)

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]: ...  # (n_last, V) q rows, draft_q applied


class ChainDraftSession:
    """The base of every chain drafter's session: write `propose_steps` (and `prefill` if it reads the prompt); rounds are chain rounds."""

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from ()

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return chain_round(self, r, tools)

    def propose(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Draft:
        """`propose_steps` answered alone (tests and tools that draft outside a run)."""
        return solo(self.propose_steps(ids, gamma, generator))

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        raise NotImplementedError


class _ModelDraftSession(ChainDraftSession):
    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig, vocab_size: int,
                 min_confidence: float, min_tokens: int, memo: QMemo | None) -> None:
        self.lm = CachedLM(model) if memo is None else None  # a memo brings its own cache
        self.memo = memo
        self.sampling = sampling
        self.vocab_size = vocab_size
        self.min_confidence = min_confidence
        self.min_tokens = min_tokens

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        return self.lm.prefill_steps(ids) if self.lm is not None else super().prefill(ids)  # a memo brings its own cache

    def _q(self, seq: Sequence[int]) -> Steps[tuple[torch.Tensor, torch.Tensor | None]]:
        """q at the end of seq (V,), and the raw logits when computed here (None from a memo)."""
        if self.memo is not None:
            return (yield from self.memo.probs(seq, 1))[0], None
        logits = (yield self.lm.feed(seq, 1))[0]  # type: ignore[union-attr]  # (V_draft,)
        return draft_q(logits, self.sampling, self.vocab_size), logits

    def _confidence(self, logits: torch.Tensor, q: torch.Tensor, x: int) -> float:
        """The draft's own belief in x: q(x) when sampling; softmax(logits)(x) when q is one-hot."""
        if not self.sampling.greedy:
            return float(q[x])
        return float(torch.softmax(logits, dim=-1)[x])

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        seq = list(ids)
        rows: list[torch.Tensor] = []
        for _ in range(gamma):
            q, logits = yield from self._q(seq)  # (V,)
            x = int(q.argmax()) if self.sampling.greedy else sample_from(q, generator)
            rows.append(q)
            seq.append(x)
            # like transformers' assistant_confidence_threshold: an unsure draft stops after this token,
            # since the tokens after it would most likely be rejected anyway
            unsure = self.min_confidence and logits is not None and self._confidence(logits, q, x) < self.min_confidence
            if unsure and len(rows) >= self.min_tokens:
                break
        q_all = torch.stack(rows) if rows else torch.zeros(0, self.vocab_size)  # (k, V)
        return Draft(tuple(seq[len(ids):]), q_all)


@dataclass(frozen=True)
class ModelDrafter:
    """A small causal LM drafts autoregressively with its own per-request KV cache (or from a memo of q)."""

    model: torch.nn.Module
    min_confidence: float = 0.0  # stop drafting after a token the draft itself rates below this (0 = never)
    min_tokens: int = 1  # ...but never before this many tokens (short verify passes can cost more, see make_drafter)
    name: str = "model"
    q_memo: QMemo | None = None  # rows of q per prefix, shared by many requests of one prompt (the Same answer lab)

    def __post_init__(self) -> None:
        if self.q_memo is not None and self.min_confidence:
            raise ValueError("a q memo keeps no logits: the confidence stop needs min_confidence = 0")

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _ModelDraftSession:
        if self.q_memo is not None and replace(self.q_memo.sampling, seed=sampling.seed) != sampling:
            raise ValueError("this drafter's q memo was built for other sampling settings")
        return _ModelDraftSession(self.model, sampling, vocab_size, self.min_confidence, self.min_tokens, self.q_memo)


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


class _NgramSession(ChainDraftSession):
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


# Measured with the default fp16w target on the 2-core AMD EPYC (qwen-coder, greedy, 32 tokens, speed-up over the
# target alone, code / list / story, 2 runs, 2026-12-01): confidence 0.2 and at least 3 tokens 1.65 / 1.71 / 0.90×;
# 0.4 (transformers' default) and at least 1 token 1.72 / 1.84 / 1.38×. An fp16w verify pass over 2 or 4 new tokens
# costs about one target step (python -m specviz why-cheap), so stopping a doubtful draft early costs nothing, and
# on creative text the low threshold drafted 8 tokens a round to keep 2. (The old floor of 3 tokens came from the
# packed fp32 target, whose passes over 2 or 3 tokens cost 2-3 steps.)
ADAPTIVE_MIN_CONFIDENCE = 0.4
ADAPTIVE_MIN_TOKENS = 1


def make_drafter(kind: str, draft_model: torch.nn.Module | None, adaptive: bool = False,
                 tree: TreeConfig | None = None) -> Drafter:
    """The drafter the CLI, the app and the benchmark use, by name (`tree`: a TreeConfig for kind "tree")."""
    if kind == "ngram":
        return NgramDrafter()
    if kind == "tree" and draft_model is not None:
        return TreeDrafter(draft_model, tree if tree is not None else TreeConfig())
    if kind != "model" or draft_model is None:
        raise ValueError(f"unknown drafter {kind!r} (choose from {', '.join(DRAFTER_KINDS)})")
    if not adaptive:
        return ModelDrafter(draft_model)
    return ModelDrafter(draft_model, min_confidence=ADAPTIVE_MIN_CONFIDENCE, min_tokens=ADAPTIVE_MIN_TOKENS)
