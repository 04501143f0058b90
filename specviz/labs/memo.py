"""Memoised distributions for the Same answer lab: a distribution is a deterministic function of its prefix, so
thousands of samples of one prompt compute each row once."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specviz.core import drafters
from specviz.core.drafters.model import ModelDrafter
from specviz.core.rounds import Drafter, Scored, Steps
from specviz.core.kv import CachedLM
from specviz.core.sampling import SamplingConfig, draft_q, logits_to_probs
from specviz.models import drafting

MEMO_BYTES = 256 * 2**20  # per memo: ~1300 rows of SmolLM2's 49k vocabulary, ~440 of Qwen's 152k


class PrefixMemo:
    """One model's next-token distributions memoised by the whole prefix; misses go through one shared KV cache.

    Thousands of short samples from one prompt ask for the same few hundred prefixes. A row is
    what the model and the sampling transform compute anyway (memoising changes no probability,
    only the cost); every random draw and accept decision is still made per sample. Misses reuse
    the prompt's keys and values through a CachedLM. Least recently used rows go first past
    `max_bytes`. Read through `MemoTarget` it is the engine's TargetProbs, and it is the memo of q for the draft.
    """

    def __init__(self, model: torch.nn.Module, transform: Callable[[torch.Tensor], torch.Tensor],
                 max_bytes: int = MEMO_BYTES, sampling: SamplingConfig | None = None) -> None:
        self.lm = CachedLM(model)
        self.transform = transform  # raw logits row (V,) -> the distribution the rule sees (V,)
        self.sampling = sampling  # the settings `transform` applies (ModelDrafter checks them against a request's)
        self.max_bytes = max_bytes
        self.rows: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]:
        """Rows (n_last, V) for the last n_last prefixes of `ids`: transform(CachedLM.logits) of each."""
        ids = tuple(ids)
        keys = [ids[: len(ids) - n_last + j + 1] for j in range(n_last)]
        found = [self.rows.get(k) for k in keys]
        missing = [j for j, row in enumerate(found) if row is None]
        self.hits += n_last - len(missing)
        if missing:
            first = missing[0]
            fresh = (yield self.lm.feed(ids, n_last - first)).logits  # (n_last - first, V): one pass from the first miss on
            self.misses += len(missing)
            for j in range(first, n_last):
                row = fresh[j - first]
                found[j] = self.transform(row)
                self._store(keys[j], found[j])
        for k in keys:
            if k in self.rows:
                self.rows.move_to_end(k)
        return torch.stack(found)  # type: ignore[arg-type]

    def _store(self, key: tuple[int, ...], row: torch.Tensor) -> None:
        if key in self.rows:
            return
        self.rows[key] = row
        self.bytes += row.element_size() * row.nelement()
        while self.bytes > self.max_bytes and len(self.rows) > 1:
            _, old = self.rows.popitem(last=False)
            self.bytes -= old.element_size() * old.nelement()


class MemoTarget:
    """The engine's TargetProbs read from a memo of p: chains and trees alike, one row per prefix (no hidden states: no
    drafter here reads them)."""

    def __init__(self, memo: PrefixMemo) -> None:
        self.memo = memo

    def prefill(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Steps[tuple[torch.Tensor, ...]]:
        """Nothing to do: rows are computed on first use (the engine calls this once per sample)."""
        _no_features(layers)
        yield from ()
        return ()

    def probs(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = ()) -> Steps[Scored]:
        _no_features(layers)
        return Scored((yield from self.memo.probs(ids, n_last)))

    def tree_probs(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   layers: tuple[int, ...] = ()) -> Steps[Scored]:
        """p after the last id and after every node: the row of each node's own prefix (ids, then its branch)."""
        _no_features(layers)
        branches: list[list[int]] = []
        for tok, par in zip(tokens, parents):
            branches.append((branches[par] if par >= 0 else []) + [tok])
        rows = [(yield from self.memo.probs(ids, 1))[0]]
        for branch in branches:
            rows.append((yield from self.memo.probs(list(ids) + branch, 1))[0])
        return Scored(torch.stack(rows))

    def commit(self, path: Sequence[int]) -> None:
        pass  # rows are kept by prefix: nothing to keep or drop


def _no_features(layers: tuple[int, ...]) -> None:
    if layers:
        raise ValueError("the memo of p keeps no hidden states: a drafter that reads the target's features cannot use it")


def target_memo(target: torch.nn.Module, sampling: SamplingConfig, max_bytes: int = MEMO_BYTES) -> PrefixMemo:
    """The target's p per prefix, processed exactly as the engine processes it (logits_to_probs)."""
    return PrefixMemo(target, lambda row: logits_to_probs(row, sampling), max_bytes, sampling)


def draft_memo(draft: torch.nn.Module, sampling: SamplingConfig, vocab_size: int, max_bytes: int = MEMO_BYTES) -> PrefixMemo:
    """The draft's q per prefix, made exactly as ModelDrafter makes it (sampling.draft_q)."""
    return PrefixMemo(draft, lambda row: draft_q(row, sampling, vocab_size), max_bytes, sampling)


def memo_drafter(draft: torch.nn.Module, sampling: SamplingConfig, vocab_size: int) -> ModelDrafter:
    """The real ModelDrafter (no confidence stop), reading q from a memo shared by every sample of one prompt."""
    return ModelDrafter(draft, q_memo=draft_memo(draft, sampling, vocab_size))


def sampling_drafter(name: str, draft: torch.nn.Module | None, target: torch.nn.Module, sampling: SamplingConfig,
                     vocab_size: int, head: Any = None) -> Drafter:
    """The sidebar's drafter for thousands of samples of one prompt: the draft model's chain or tree reading q from a
    memo shared by every sample (the same rows, computed once); any other kind as the registry builds it."""
    models = drafting.Models(target, draft, head)
    if (problem := drafting.why_not(name, models)) is not None:
        raise ValueError(f"{problem} Choose another drafter.")
    memo = draft_memo(draft, sampling, vocab_size) if drafters.spec(name).needs_draft_model else None  # type: ignore[arg-type]
    return drafting.resolve(name, models, q_memo=memo)


