"""The EAGLE-style drafters: a chain (`eagle`) or a tree (`eagle-tree`, EAGLE-2) guessed by a one-layer head from the target's features.

After every verify pass the run hears the target's features at the kept positions (`Kept.hidden`), so
the head always knows the real feature of every position but the newest token's, which is exactly
what it needs: the pair (feature at M-2, token M-1) guesses token M. Its guesses then feed its own
guessed feature forward, one pair per drafted token. Pairs with real features stay in its KV cache
from round to round; the guessed ones are dropped before the next round, which brings real features
for what was kept. A tree's branches share that cache: each guessed pair attends to the real pairs and
to its own ancestors only. The head is computed here, alone (one small layer); the target's passes are
batched as every run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz.core.drafters import Parts
from specviz.core.drafters.tree import TreeConfig, TreeSession, _Cand
from specviz.core.head import EagleHead
from specviz.core.rounds import Session, Draft, Kept, Steps
from specviz.core.sampling import SamplingConfig, draft_confidence, sample_from
from specviz.core.tree_rule import DraftTree

LAST_LAYER = -1  # transformers' hidden_states[-1]: the last layer's output after the final norm (what the target's head reads)
RANK = SamplingConfig("sample")  # a greedy run's tree ranks its alternatives by the head's plain softmax


class _HeadState:
    """The head's view of one run: the target's features heard so far and the head's KV cache of real pairs."""

    def __init__(self, head: EagleHead, vocab_size: int) -> None:
        if head.vocab.size != vocab_size:
            raise ValueError(f"this head drafts over a vocabulary of {head.vocab.size}, the target has {vocab_size}")
        self.head = head
        self.cache = head.new_cache()
        self.real = 0  # pairs in the head's cache built from real features (positions 0..real-1)
        self.feats: list[torch.Tensor] = []  # the target's feature (d,) at each position heard so far

    def hear(self, kept: Kept) -> None:
        if not kept.hidden:
            return
        rows = kept.hidden[0]  # (rows, d) at positions kept.start...
        del self.feats[kept.start:]
        self.feats.extend(rows.float().unbind(0))

    def ready(self, ids: Sequence[int]) -> bool:
        """Whether the head has the features it needs to guess after ids (the prefill's, at least)."""
        return len(ids) >= 2 and len(self.feats) >= len(ids) - 1

    def catch_up(self, ids: Sequence[int]) -> torch.Tensor:
        """Drop last round's guessed pairs, add the real pairs not yet cached; f̂ (1, d) at M-1, which guesses token M."""
        last = len(ids) - 2  # the pair (feature at M-2, token M-1)
        extra = self.cache.get_seq_length() - self.real
        if extra > 0:
            self.cache.crop(-extra)  # DynamicCache.crop takes a negative count
        fresh = range(self.real, last + 1)
        guessed = self.head(torch.stack([self.feats[i] for i in fresh]), torch.tensor([ids[i + 1] for i in fresh]),
                            torch.tensor(list(fresh)), self.cache)[-1:]
        self.real = last + 1
        return guessed


class _EagleSession(Session):
    features = (LAST_LAYER,)

    def __init__(self, head: EagleHead, sampling: SamplingConfig, vocab_size: int, min_confidence: float,
                 min_tokens: int) -> None:
        self.state = _HeadState(head, vocab_size)
        self.head = head
        self.sampling = sampling
        self.min_confidence = min_confidence
        self.min_tokens = min_tokens

    def hear(self, kept: Kept) -> None:
        self.state.hear(kept)

    @torch.inference_mode()
    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()  # no model pass: the head runs here
        if gamma <= 0 or not self.state.ready(ids):
            return Draft((), torch.zeros(0, self.head.vocab.size))
        guessed = self.state.catch_up(ids)
        first = len(ids) - 1  # the position of the first guessed pair
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(gamma):
            logits = self.head.logits(guessed)[0]  # (N,)
            q = self.head.vocab.q(logits, self.sampling)  # (V,)
            x = int(q.argmax()) if self.sampling.greedy else sample_from(q, generator)
            tokens.append(x)
            rows.append(q)
            # the confidence stop, as the model drafter's: the guesses after an unsure one are mostly rejected, and
            # each costs a head step and a wider verify pass
            # (greedy: x is the head's top id, at its logits' argmax row)
            unsure = self.min_confidence and draft_confidence(
                q, x, self.sampling, logits.float(), int(logits.argmax())) < self.min_confidence
            if unsure and len(tokens) >= self.min_tokens:
                break
            if step + 1 < gamma:  # the next pair: the guessed feature and the token just drafted
                guessed = self.head(guessed, torch.tensor([x]), torch.tensor([first + step]), self.state.cache)
        return Draft(tuple(tokens), torch.stack(rows))


class _EagleTreeSession(TreeSession):
    """EAGLE-2's dynamic tree from the head: the tree search of `TreeSession`, its rows of q from the head's guesses."""

    features = (LAST_LAYER,)

    def __init__(self, head: EagleHead, config: TreeConfig, sampling: SamplingConfig, vocab_size: int) -> None:
        self.state = _HeadState(head, vocab_size)
        self.head = head
        self.lm = None
        self.memo = None
        self.config = config
        self.sampling = sampling
        self.vocab_size = vocab_size
        self._entries: list[int] = []
        self._root: torch.Tensor | None = None  # f̂ at M-1
        self._guessed: list[torch.Tensor] = []  # f̂ (1, d) after each expanded node, by its entry
        self._branches: dict[int, list[int]] = {}  # entry -> the entries from the root's child down to it

    def _head_rows(self, guessed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (the rule's law, 0 outside the draft vocabulary) and the ranking law (m, V) from guessed features (m, d)."""
        logits = self.head.logits(guessed)
        q = self.head.vocab.q(logits, self.sampling)
        return q, (q if not self.sampling.greedy else self.head.vocab.q(logits, RANK))

    @torch.inference_mode()
    def _root_rows(self, ids: Sequence[int]) -> Steps[tuple[torch.Tensor, torch.Tensor]]:
        yield from ()
        self._root = self.state.catch_up(ids)
        self._guessed = []
        return self._head_rows(self._root)

    @torch.inference_mode()
    def _level_rows(self, ids: Sequence[int], cands: list[_Cand], expand: list[int],
                    parents: list[int]) -> Steps[tuple[torch.Tensor, torch.Tensor]]:
        """One head step for the level's expanded nodes together: each pair (its parent's f̂, its token) sees the real
        pairs and its ancestors' guessed pairs only."""
        yield from ()
        past = self.state.cache.get_seq_length()
        real = self.state.real
        m = len(expand)
        sees = torch.zeros(m, past + m, dtype=torch.bool)
        sees[:, :real] = True
        ancestry = {}  # entry -> the entries on its branch (itself included)
        for e, c in enumerate(expand):
            entry = len(self._guessed) + e
            parent = parents[e]
            ancestry[entry] = (self._branches[parent] if parent >= 0 else []) + [entry]
            sees[e, [real + a for a in ancestry[entry]]] = True
        self._branches.update(ancestry)
        feats = torch.cat([self._root if p < 0 else self._guessed[p] for p in parents])
        tokens = torch.tensor([cands[c].token for c in expand])
        positions = torch.tensor([len(ids) - 2 + cands[c].depth for c in expand])
        out = self.head(feats, tokens, positions, self.state.cache, sees=sees)  # (m, d)
        self._guessed.extend(out[e:e + 1] for e in range(m))  # entry order: the tree search numbers them the same way
        return self._head_rows(out)

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        if not self.state.ready(ids):  # nothing heard yet: a tree of no nodes (a plain target step)
            yield from ()
            return DraftTree((), (), (), torch.zeros(1, self.vocab_size))
        self._branches = {}
        return (yield from super().propose_tree_steps(ids, max_depth, generator))

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from ()

    def commit(self, path: Sequence[int]) -> None:
        pass  # guessed pairs are dropped next round: the target's real features replace them

    def hear(self, kept: Kept) -> None:
        self.state.hear(kept)


@dataclass(frozen=True)
class EagleDrafter:
    """A one-layer head on the target's features drafts a chain of γ tokens over its reduced vocabulary."""

    head: EagleHead
    min_confidence: float = 0.0  # stop drafting after a token the head itself rates below this (0 = never)
    min_tokens: int = 1  # ...but never before this many tokens
    name: str = "eagle"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _EagleSession:
        return _EagleSession(self.head, sampling, vocab_size, self.min_confidence, self.min_tokens)


@dataclass(frozen=True)
class EagleTreeDrafter:
    """The head drafts a tree per round (EAGLE-2: expand the nodes it is most sure of)."""

    head: EagleHead
    config: TreeConfig = TreeConfig()
    name: str = "eagle-tree"

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> _EagleTreeSession:
        return _EagleTreeSession(self.head, self.config, sampling, vocab_size)


# the head's confidence stop in adaptive runs (measured: README, "Why these defaults")
EAGLE_MIN_CONFIDENCE = 0.5


def from_parts(parts: Parts) -> EagleDrafter:
    """The registry's "eagle" drafter: the pair's trained head, a chain, with the confidence stop when adaptive."""
    if parts.head is None:
        raise ValueError("the eagle drafter needs the pair's trained head")
    return EagleDrafter(parts.head, min_confidence=EAGLE_MIN_CONFIDENCE if parts.adaptive else 0.0)


def tree_from_parts(parts: Parts) -> EagleTreeDrafter:
    """The registry's "eagle-tree" drafter: the pair's trained head, a tree of the given shape (TreeConfig's defaults)."""
    if parts.head is None:
        raise ValueError("the eagle-tree drafter needs the pair's trained head")
    return EagleTreeDrafter(parts.head, parts.tree if parts.tree is not None else TreeConfig())
