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
        self.features: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], tuple[torch.Tensor, ...]] = OrderedDict()
        self.feature_bytes = 0
        self.hits = 0
        self.misses = 0

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]:
        """Rows (n_last, V) for the last n_last prefixes of `ids`: transform(CachedLM.logits) of each."""
        return (yield from self.scored(ids, n_last)).p

    def scored(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = ()) -> Steps[Scored]:
        """The rows of `probs`, and with `layers` the model's hidden states at the same positions (one (n_last, d) per
        layer): a position's hidden state, like its row, depends on its prefix alone, so a drafter that reads the
        target's features (a head) is served from the memo too."""
        ids = tuple(ids)
        keys = [ids[: len(ids) - n_last + j + 1] for j in range(n_last)]
        found = [self.rows.get(k) for k in keys]
        feats = [self.features.get((k, layers)) if layers else () for k in keys]
        missing = [j for j in range(n_last) if found[j] is None or feats[j] is None]
        self.hits += n_last - len(missing)
        if missing:
            first = missing[0]
            answer = yield self.lm.feed(ids, n_last - first, layers)  # one pass from the first miss on
            self.misses += len(missing)
            for j in range(first, n_last):
                if found[j] is None:
                    found[j] = self.transform(answer.logits[j - first])
                    self._store(keys[j], found[j])
                if feats[j] is None:
                    feats[j] = tuple(h[j - first].clone() for h in answer.hidden)
                    self._store_features((keys[j], layers), feats[j])  # type: ignore[arg-type]
        for k in keys:
            if k in self.rows:
                self.rows.move_to_end(k)
        hidden = tuple(torch.stack([f[i] for f in feats]) for i in range(len(layers)))  # type: ignore[index]
        return Scored(torch.stack(found), hidden)  # type: ignore[arg-type]

    def prefill(self, ids: Sequence[int], layers: tuple[int, ...]) -> Steps[tuple[torch.Tensor, ...]]:
        """The hidden states (len(ids) - 1, d) per layer at every position but the last (what a prefill gives a drafter
        that reads the target's features), memoised by prefix like the rows."""
        ids = tuple(ids)
        keys = [(ids[: i + 1], layers) for i in range(len(ids) - 1)]
        if not layers or not keys:
            return ()
        feats = [self.features.get(k) for k in keys]
        if any(f is None for f in feats):
            self.lm.crop(0)  # a prefill pass answers only the positions it feeds: feed them all
            answer = yield self.lm.prefill_feed(ids, layers)
            self.misses += 1
            feats = [tuple(h[i].clone() for h in answer.hidden) for i in range(len(keys))]
            for key, f in zip(keys, feats):
                self._store_features(key, f)
        return tuple(torch.stack([f[i] for f in feats]) for i in range(len(layers)))  # type: ignore[index]

    def _store_features(self, key: tuple[tuple[int, ...], tuple[int, ...]], rows: tuple[torch.Tensor, ...]) -> None:
        """Hidden rows are small beside a vocabulary's row (1536 floats against 152k): kept up to the same budget."""
        if key in self.features:
            return
        self.features[key] = rows
        self.feature_bytes += sum(r.element_size() * r.nelement() for r in rows)
        while self.feature_bytes > self.max_bytes and len(self.features) > 1:
            _, old = self.features.popitem(last=False)
            self.feature_bytes -= sum(r.element_size() * r.nelement() for r in old)

    def _store(self, key: tuple[int, ...], row: torch.Tensor) -> None:
        if key in self.rows:
            return
        self.rows[key] = row
        self.bytes += row.element_size() * row.nelement()
        while self.bytes > self.max_bytes and len(self.rows) > 1:
            _, old = self.rows.popitem(last=False)
            self.bytes -= old.element_size() * old.nelement()


class MemoTarget:
    """The engine's TargetProbs read from a memo of p (and of the hidden states a head reads): chains and trees alike,
    one row per prefix."""

    def __init__(self, memo: PrefixMemo) -> None:
        self.memo = memo

    def prefill(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Steps[tuple[torch.Tensor, ...]]:
        """The prompt's hidden states where a drafter reads them (memoised); otherwise nothing to do: rows are computed on
        first use (the engine calls this once per sample)."""
        return (yield from self.memo.prefill(ids, layers))

    def probs(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = ()) -> Steps[Scored]:
        return (yield from self.memo.scored(ids, n_last, layers))

    def tree_probs(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   layers: tuple[int, ...] = ()) -> Steps[Scored]:
        """p after the last id and after every node: the row of each node's own prefix (ids, then its branch)."""
        branches: list[list[int]] = []
        for tok, par in zip(tokens, parents):
            branches.append((branches[par] if par >= 0 else []) + [tok])
        rows = [(yield from self.memo.scored(ids, 1, layers))]
        for branch in branches:
            rows.append((yield from self.memo.scored(list(ids) + branch, 1, layers)))
        return Scored(torch.cat([r.p for r in rows]), tuple(torch.cat([r.hidden[i] for r in rows])
                                                             for i in range(len(layers))))

    def commit(self, path: Sequence[int]) -> None:
        pass  # rows are kept by prefix: nothing to keep or drop


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


