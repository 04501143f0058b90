"""Token trees: the tree config, a KV cache that holds a tree of uncommitted entries, and the tree drafter.

A tree round drafts several alternative continuations at once; the target scores every node in
one pass where each node sees the committed prefix and its own ancestors only (a 4-D mask and
position id = prefix length + depth). After the verdict both caches keep only the accepted
branch, gathered from the entries already computed (nothing is recomputed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from specviz.core.drafters import _fit_vocab
from specviz.core.kv import CachedLM, common_prefix_len
from specviz.core.sampling import SamplingConfig, logits_to_probs, sample_from

BUDGET_RANGE = (1, 64)
BRANCHING_RANGE = (1, 8)
DEPTH_RANGE = (1, 16)


@dataclass(frozen=True)
class TreeConfig:
    """The shape of a drafted tree; the chain of γ tokens is TreeConfig(budget=γ, branching=1, depth=γ)."""

    # Defaults measured with packed target linears (a verify pass over 4 / 17 nodes costs ~1.0 / ~1.7 target
    # steps), qwen-coder, greedy, 32 tokens, 2-core AMD EPYC, 2026-12-01, speed-up over the target alone,
    # code / list / story (tokens per target call), a driver over the bench's prompts, 2 runs each:
    #   24, 2, 12, 0.15  2.26 / 2.65 / 1.32×  (10.7 / 6.4 / 2.7)   <- these defaults
    #   32, 2, 16, 0.05  1.88 / 3.05 / 1.34×  (10.7 / 10.7 / 3.6)
    #   32, 2, 16, 0.02  1.95 / 2.72 / 1.46×  (10.7 / 10.7 / 4.0)
    #   32, 3, 16, 0.05  2.03 / 2.62 / 1.59×  (10.7 / 10.7 / 3.6)
    # and in `bench --quick` runs 24, 2, 12, 0.15 gave 2.66 / 2.48 / 1.45×, 32, 2, 16, 0.02 gave 1.91 / 2.87 / 1.32×:
    # the bigger tree gets more tokens per call on list and story but drafts more levels for them, and on
    # code (same tokens per call under every setting) those levels are pure cost. Spread between runs ~0.3×.
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


@dataclass(frozen=True)
class DraftTree:
    """A drafter's proposed tree: nodes in an order where parents come before children.

    Siblings appear in the order the rule tries them. A `sampled` node was drawn from q and is
    always its parent's first child; the others are deterministic picks (the draft's next best).
    """

    tokens: tuple[int, ...]  # (n,) token of each node
    parents: tuple[int, ...]  # (n,) index of the parent node; -1 = the root (last committed token)
    sampled: tuple[bool, ...]  # (n,) drawn from q (tried with min(1, p/q)) or picked (tried as a one-hot draft)
    q: torch.Tensor  # (n+1, V) draft distribution after the root (row 0) and after node i (row i+1); zeros where never computed

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node, 1 for the root's children."""
        out: list[int] = []
        for par in self.parents:
            out.append(1 if par < 0 else out[par] + 1)
        return tuple(out)

    def children(self, node: int) -> list[int]:
        """Child indices of a node (-1 = root) in try order."""
        return [i for i, par in enumerate(self.parents) if par == node]

    def branch(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """(n, n) bool: entry [i, j] is True when node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    return anc


class TreeLM(CachedLM):
    """A CachedLM whose cache may end with uncommitted tree entries after the committed `ids`.

    `tree_logits` feeds tree nodes (each sees the committed ids and its ancestors) in one pass;
    `commit` keeps one branch of them by gathering its cached keys/values; a plain `logits`
    call drops the tree first, so this class answers every CachedLM question the same way.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.tree_tokens: list[int] = []  # tokens of the cached tree entries, in cache order
        self.tree_parents: list[int] = []  # parent entry of each (-1 = the end of the committed ids)
        self.dtype = getattr(model, "dtype", torch.float32)

    def drop_tree(self) -> None:
        """Forget every uncommitted tree entry."""
        if self.tree_tokens:
            self.cache.crop(-len(self.tree_tokens))
            self.tree_tokens, self.tree_parents = [], []

    @torch.inference_mode()
    def logits(self, ids: Sequence[int], n_last: int) -> torch.Tensor:
        self.drop_tree()
        return super().logits(ids, n_last)

    @torch.inference_mode()
    def tree_logits(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int], with_root: bool) -> torch.Tensor:
        """Logits of new tree nodes (n, V), preceded by the last id's row when with_root: (1+n, V).

        `parents` index the tree entries (those cached before this call come first); -1 hangs a
        node under the last committed id. Ids not yet cached are fed causally in the same pass.
        """
        keep = common_prefix_len(self.ids, ids)
        if with_root:
            keep = min(keep, len(ids) - 1)  # the root's own logits are wanted: feed it again
        if keep < len(self.ids) or keep < len(ids):
            self.drop_tree()  # the committed ids change: tree entries after them are stale
            self.crop(keep)
        chain = list(ids[keep:])
        old = len(self.tree_tokens)
        all_parents = self.tree_parents + list(parents)
        mask, positions = self._tree_mask(len(ids), len(chain), old, all_parents)
        feed = torch.tensor([chain + list(tokens)], dtype=torch.long, device=self.device)  # (1, c+n)
        out = self.model(input_ids=feed, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True)
        self.ids.extend(chain)
        self.tree_tokens += list(tokens)
        self.tree_parents = all_parents
        first = len(chain) - 1 if with_root else len(chain)
        return out.logits[0, first:].float()  # (1+n or n, V)

    def _tree_mask(self, n_committed: int, n_chain: int, n_old: int, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive 4-D mask (1, 1, c+n, kv) and position ids (1, c+n) of the rows fed now.

        Float, not bool: transformers returns a 4-D mask as-is, and its eager attention adds it to
        the scores while sdpa takes a float mask as additive too, so one mask serves both paths.
        """
        n_tree = len(parents)
        n_new_tree = n_tree - n_old
        kv = n_committed + n_tree
        visible = torch.zeros(n_chain + n_new_tree, kv, dtype=torch.bool)
        start = n_committed - n_chain  # absolute position of the first chain row
        for r in range(n_chain):
            visible[r, : start + r + 1] = True  # causal over the committed ids
        anc = ancestor_matrix(parents)  # (n_tree, n_tree)
        visible[n_chain:, :n_committed] = True  # every node sees the whole committed prefix...
        visible[n_chain:, n_committed:] = anc[n_old:]  # ...and its own ancestors and itself only
        depth = anc.sum(dim=1)  # (n_tree,) ancestors-or-self = depth (1 under the root)
        pos = torch.cat([torch.arange(start, n_committed), n_committed - 1 + depth[n_old:]])  # (c+n,)
        mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device), pos[None].to(self.device)

    @torch.inference_mode()
    def commit(self, entries: Sequence[int]) -> None:
        """Keep the cached tree entries on one branch (root to leaf) as committed ids; drop the others.

        Their keys/values are moved into place from the cache itself: positions were already
        prefix length + depth, so the kept rows are exactly what a plain pass would have made.
        """
        entries = [e for e in entries if e < len(self.tree_tokens)]
        base = len(self.ids)
        if entries:
            idx = torch.tensor(entries, dtype=torch.long, device=self.device) + base  # (m,)
            for layer in self.cache.layers:
                if type(layer) is not DynamicLayer:
                    raise NotImplementedError("tree caches need full-attention layers (no sliding window)")
                # index on the right copies first, so overlapping source and destination are safe
                layer.keys[..., base : base + len(entries), :] = layer.keys[..., idx, :]
                layer.values[..., base : base + len(entries), :] = layer.values[..., idx, :]
        extra = len(self.tree_tokens) - len(entries)
        if extra:
            self.cache.crop(-extra)
        self.ids.extend(self.tree_tokens[e] for e in entries)
        self.tree_tokens, self.tree_parents = [], []


# ------------------------------------------------------------------------------------------
# The tree drafter
# ------------------------------------------------------------------------------------------


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


class TreeSession:
    """A tree drafter bound to one request: its own TreeLM over the draft model."""

    def __init__(self, model: torch.nn.Module, config: TreeConfig, sampling: SamplingConfig, vocab_size: int) -> None:
        self.lm = TreeLM(model)
        self.config = config
        self.sampling = sampling
        self.vocab_size = vocab_size
        self._entries: list[int] = []  # draft cache entry of each node of the last proposed tree

    def _rows(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (the rule's draft law) and the ranking law: q itself when sampling, softmax of the logits when greedy
        (greedy q is one-hot, which cannot rank the alternatives)."""
        q = _fit_vocab(logits_to_probs(logits, self.sampling), self.vocab_size)  # (m, V)
        rank = q if not self.sampling.greedy else _fit_vocab(torch.softmax(logits.float(), -1), self.vocab_size)
        return q, rank

    def propose_tree(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> DraftTree:
        """Draft a tree of at most config.budget nodes and min(config.depth, max_depth) levels, one draft pass per level."""
        cfg = self.config
        q_root, rank_root = self._rows(self.lm.logits(ids, 1))
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
            q_lvl, rank_lvl = self._rows(self.lm.tree_logits(ids, [cands[c].token for c in expand], parents, with_root=False))
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
        entries = []
        for node in path:
            if self._entries[node] >= len(self.lm.tree_tokens):
                break  # the deepest nodes were never fed to the draft: the next round feeds them
            entries.append(self._entries[node])
        self.lm.commit(entries)


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

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> TreeSession:
        session = TreeSession(self.model, self.config, sampling, vocab_size)
        session.lm.prefill(prompt_ids)
        return session
