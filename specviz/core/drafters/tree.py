"""The tree drafter: the draft model drafts a token tree per round (EAGLE-2-style: expand the most promising nodes by q); `core.tree` plays its rounds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from specviz.core.drafters import Parts
from specviz.core.drafters.model import QMemo
from specviz.core.kv import TreeLM
from specviz.core.rounds import Kept, Round, RunTools, Session, Steps, solo, tree_round
from specviz.core.sampling import SamplingConfig, fit_vocab, logits_to_probs, sample_from
from specviz.core.trace import RoundTrace
from specviz.core.tree_rule import DraftTree

BUDGET_RANGE = (1, 64)
BRANCHING_RANGE = (1, 8)
DEPTH_RANGE = (1, 16)


@dataclass(frozen=True)
class TreeConfig:
    """The shape of a drafted tree; the chain of γ tokens is TreeConfig(budget=γ, branching=1, depth=γ)."""

    # the defaults were measured on real weights: README, "Why these defaults"
    budget: int = 24  # nodes the target verifies per round at most
    branching: int = 2  # children per expanded node, and nodes expanded per level (EAGLE-2's top-k)
    depth: int = 12  # longest branch, i.e. most drafted tokens one round can accept (also the draft passes)
    min_score: float = 0.15  # leave out nodes whose path probability (by the draft) is below this: neither expanded nor verified

    def __post_init__(self) -> None:
        for name, (lo, hi) in (("budget", BUDGET_RANGE), ("branching", BRANCHING_RANGE), ("depth", DEPTH_RANGE)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"tree {name} must be in {lo}..{hi}, got {value}")
        if not 0.0 <= self.min_score < 1.0:
            raise ValueError(f"tree min_score must be in [0, 1), got {self.min_score}")


def pick_children(rank: torch.Tensor, k: int, first: int | None) -> list[tuple[int, bool]]:
    """Up to k children (token, sampled) of one node.

    first: a token already drawn from q (sampling mode), tried first; the rest are the draft's
    most likely tokens by `rank` (V,), distinct and with rank > 0 (a token the sampling transform
    removed has rank 0 and is never picked).
    """
    out: list[tuple[int, bool]] = [(first, True)] if first is not None else []
    if k > len(out):
        for tok in torch.topk(rank, min(k + 1, rank.shape[-1])).indices.tolist():
            if len(out) >= k:
                break
            if tok != first and rank[tok] > 0:
                out.append((tok, False))
    return out


@dataclass
class _Cand:
    """A candidate node while drafting (mutable scratch, never leaves this module)."""

    token: int
    parent: int  # candidate index, -1 = root
    depth: int
    score: float  # the draft's path probability, the EAGLE-2 ranking
    sampled: bool
    entry: int = -1  # its entry in the draft's tree cache, -1 if never fed
    row: torch.Tensor | None = None  # q after it, when fed


class TreeSession(Session):
    """A tree drafter bound to one request: its own TreeLM over the draft model, or rows of q from a memo shared by many samples."""

    def __init__(self, model: torch.nn.Module, config: TreeConfig, sampling: SamplingConfig, vocab_size: int,
                 memo: QMemo | None = None) -> None:
        if memo is not None and sampling.greedy:
            raise ValueError("a q memo keeps no logits: a greedy tree needs them to rank the alternatives")
        self.lm = TreeLM(model) if memo is None else None  # a memo brings its own cache
        self.memo = memo
        self.config = config
        self.sampling = sampling
        self.vocab_size = vocab_size
        self._entries: list[int] = []  # draft cache entry of each node of the last proposed tree

    def _rows(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (the rule's draft law) and the ranking law: q itself when sampling, softmax of the logits when greedy
        (greedy q is one-hot, which cannot rank the alternatives)."""
        q = fit_vocab(logits_to_probs(logits, self.sampling), self.vocab_size)  # (m, V)
        rank = q if not self.sampling.greedy else fit_vocab(torch.softmax(logits.float(), -1), self.vocab_size)
        return q, rank

    def _root_rows(self, ids: Sequence[int]) -> Steps[tuple[torch.Tensor, torch.Tensor]]:
        """q and rank (1, V) after the run's ids."""
        if self.memo is not None:
            q = yield from self.memo.probs(ids, 1)
            return q, q
        return self._rows((yield self.lm.feed(ids, 1)).logits)  # type: ignore[union-attr]

    def _level_rows(self, ids: Sequence[int], cands: list[_Cand], expand: list[int],
                    parents: list[int]) -> Steps[tuple[torch.Tensor, torch.Tensor]]:
        """q and rank (m, V) after each expanded candidate: one tree pass of the draft, or a memo row per prefix."""
        if self.memo is not None:
            rows = []
            for c in expand:
                rows.append((yield from self.memo.probs(list(ids) + [cands[a].token for a in _branch(cands, c)], 1))[0])
            q = torch.stack(rows)
            return q, q
        level_feed = self.lm.tree_feed(ids, [cands[c].token for c in expand], parents, with_root=False)  # type: ignore[union-attr]
        return self._rows((yield level_feed).logits)

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        if self.lm is not None:
            yield from self.lm.prefill_steps(ids)

    def propose_tree(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> DraftTree:
        """`propose_tree_steps` answered alone (tests and tools that draft outside a run)."""
        return solo(self.propose_tree_steps(ids, max_depth, generator))

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        """Draft a tree of at most config.budget nodes and min(config.depth, max_depth) levels, one draft pass per level."""
        cfg = self.config
        q_root, rank_root = yield from self._root_rows(ids)
        cands: list[_Cand] = []
        frontier = [(-1, 1.0, q_root[0], rank_root[0])]  # (candidate, path score, q, rank) of nodes to expand
        n_entries = 0
        for depth in range(1, min(cfg.depth, max_depth) + 1):
            level: list[int] = []
            for parent, score, q, rank in frontier:
                first = None if self.sampling.greedy else sample_from(q, generator)
                for tok, sampled in pick_children(rank, cfg.branching, first):
                    level.append(len(cands))
                    cands.append(_Cand(tok, parent, depth, score * float(rank[tok]), sampled))
            expand = sorted(level, key=lambda c: -cands[c].score)[: cfg.branching]
            expand = [c for c in expand if cands[c].score > cfg.min_score]
            if depth == min(cfg.depth, max_depth) or not expand:
                break
            for c in expand:
                cands[c].entry, n_entries = n_entries, n_entries + 1
            parents = [cands[cands[c].parent].entry if cands[c].parent >= 0 else -1 for c in expand]
            q_lvl, rank_lvl = yield from self._level_rows(ids, cands, expand, parents)
            frontier = [(c, cands[c].score, q_lvl[i], rank_lvl[i]) for i, c in enumerate(expand)]
            for i, c in enumerate(expand):
                cands[c].row = q_lvl[i]
        return self._select(cands, q_root[0])

    def _select(self, cands: list[_Cand], q_root: torch.Tensor) -> DraftTree:
        """The budget's best candidates by path score (ancestor-closed: a child never outscores its parent).

        Candidates below min_score are left out, all but the best one: where the draft is unsure the
        tree stays small: fewer nodes verified, and fewer levels drafted.
        """
        ranked = sorted(range(len(cands)), key=lambda c: (-cands[c].score, cands[c].depth, c))
        best = [c for i, c in enumerate(ranked) if i == 0 or cands[c].score >= self.config.min_score][: self.config.budget]
        keep = sorted(set(best), key=lambda c: (cands[c].depth, c))  # parents first; siblings in try order
        # a child can tie its parent's score (q = 1): make sure every kept node's parent is kept too
        kept = set(keep)
        keep = [c for c in keep if all(a in kept for a in _ancestors(cands, c))]
        index = {c: i for i, c in enumerate(keep)}
        zeros = torch.zeros_like(q_root)
        q = torch.stack([q_root] + [cands[c].row if cands[c].row is not None else zeros for c in keep])  # (n+1, V)
        self._entries = [cands[c].entry if cands[c].entry >= 0 else 1 << 30 for c in keep]
        return DraftTree(
            tokens=tuple(cands[c].token for c in keep),
            parents=tuple(index[cands[c].parent] if cands[c].parent >= 0 else -1 for c in keep),
            sampled=tuple(cands[c].sampled for c in keep),
            q=q,
        )

    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted branch (node indices of the last proposed tree) in the draft's cache."""
        if self.lm is None:
            return  # a memo keeps rows by prefix: nothing to keep or drop
        entries = []
        for node in path:
            if self._entries[node] >= len(self.lm.tree_tokens):
                break  # the deepest nodes were never fed to the draft: the next round feeds them
            entries.append(self._entries[node])
        self.lm.commit(entries)

    def hear(self, kept: Kept) -> None:
        self.commit(kept.path)

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return tree_round(self, r, tools)


def _branch(cands: list[_Cand], c: int) -> list[int]:
    """Candidate indices from the root's child down to c."""
    return _ancestors(cands, c)[::-1] + [c]


def _ancestors(cands: list[_Cand], c: int) -> list[int]:
    out = []
    while cands[c].parent >= 0:
        c = cands[c].parent
        out.append(c)
    return out


@dataclass(frozen=True)
class TreeDrafter:
    """The draft model drafts a tree per round (EAGLE-2-style: expand the most promising nodes by q)."""

    model: torch.nn.Module
    config: TreeConfig = TreeConfig()
    name: str = "tree"
    q_memo: QMemo | None = None  # rows of q per prefix, shared by many requests of one prompt (the Same answer lab)

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> TreeSession:
        if self.q_memo is not None and replace(self.q_memo.sampling, seed=sampling.seed) != sampling:
            raise ValueError("this drafter's q memo was built for other sampling settings")
        return TreeSession(self.model, self.config, sampling, vocab_size, self.q_memo)


def from_parts(parts: Parts) -> TreeDrafter:
    """The registry's "tree" drafter: the pair's draft model, the given shape or TreeConfig's defaults."""
    if parts.draft is None:
        raise ValueError("the tree drafter needs a draft model")
    return TreeDrafter(parts.draft, parts.tree if parts.tree is not None else TreeConfig(), q_memo=parts.q_memo)
