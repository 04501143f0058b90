"""Token trees: the tree config, the tree drafter and its round (draft a tree, verify it in one target pass, keep the accepted branch).

A tree round drafts several alternative continuations at once; the target scores every node in
one pass where each node sees the committed prefix and its own ancestors only (a 4-D mask and
position id = prefix length + depth). After the verdict both caches keep only the accepted
branch, gathered from the entries already computed (nothing is recomputed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specviz.core import clock
from specviz.core.clock import ms_since
from specviz.core.kv import TreeLM
from specviz.core.rounds import CachedTarget, Round, RunTools, Steps, TargetAlone, solo, top_dist
from specviz.core.sampling import SamplingConfig, fit_vocab, logits_to_probs, sample_from
from specviz.core.trace import RoundTrace, TreeNode, TreeTrace
from specviz.core.tree_rule import DraftTree, TreeVerdict, verify_tree

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
        q = fit_vocab(logits_to_probs(logits, self.sampling), self.vocab_size)  # (m, V)
        rank = q if not self.sampling.greedy else fit_vocab(torch.softmax(logits.float(), -1), self.vocab_size)
        return q, rank

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        return self.lm.prefill_steps(ids)

    def propose_tree(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> DraftTree:
        """`propose_tree_steps` answered alone (tests and tools that draft outside a run)."""
        return solo(self.propose_tree_steps(ids, max_depth, generator))

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        """Draft a tree of at most config.budget nodes and min(config.depth, max_depth) levels, one draft pass per level."""
        cfg = self.config
        q_root, rank_root = self._rows((yield self.lm.feed(ids, 1)))
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
            level_feed = self.lm.tree_feed(ids, [cands[c].token for c in expand], parents, with_root=False)
            q_lvl, rank_lvl = self._rows((yield level_feed))
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

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        """A tree round; a round that may draft nothing (γ 0 from the policy, or one token of budget left) is a plain target step."""
        if not min(r.gamma, r.budget - 1):
            return (yield from TargetAlone().round(r, tools))
        target = tools.target
        if not isinstance(target, CachedTarget):
            raise ValueError("a tree drafter needs the target's own tree cache (other target_probs serve chains only)")
        t = clock.now()
        tree = yield from self.propose_tree_steps(r.ids, r.budget - 1, tools.generator)  # depth bounded by the budget, not by γ
        draft_ms = ms_since(t)
        t = clock.now()
        p = yield from target.tree_probs(r.ids, tree.tokens, tree.parents)  # (n+1, V)
        verdict = verify_tree(p, tree, tools.generator)
        target.commit(verdict.path)
        self.commit(verdict.path)
        verify_ms = ms_since(t)
        return tree_round_trace(r, tree, p.cpu(), verdict, tools, draft_ms, verify_ms)


def tree_round_trace(r: Round, tree: DraftTree, p: torch.Tensor, v: TreeVerdict, tools: RunTools, draft_ms: float,
                     verify_ms: float) -> RoundTrace:
    """A RoundTrace whose `tree` holds every node; its chain fields list the accepted path, then the rest."""
    n, texts, top_n = len(tree.tokens), tools.texts, tools.top_n
    rows = torch.tensor([par + 1 for par in tree.parents], dtype=torch.long)  # (n,) the row each node was drafted from
    toks = torch.tensor(tree.tokens, dtype=torch.long)
    p_x = p[rows, toks].tolist() if n else []
    q_x = tree.q[rows, toks].tolist() if n else []
    tried = {c: (a, u) for c, a, u in zip(v.tried, v.accept_probs, v.uniforms)}
    on_path = set(v.path)
    token_texts = texts(tree.tokens)
    nodes = tuple(
        TreeNode(
            token=tree.tokens[i], text=token_texts[i], parent=tree.parents[i], depth=d, p=p_x[i], q=q_x[i],
            sampled=tree.sampled[i], accept_prob=tried[i][0] if i in tried else None,
            uniform=tried[i][1] if i in tried else None,
            verdict="accepted" if i in on_path else ("rejected" if i in tried else "unreached"),
        )
        for i, d in zip(range(n), tree.depths)
    )
    order = list(v.path) + [i for i in range(n) if i not in on_path]
    end = v.path[-1] + 1 if v.path else 0  # the row where the target decided
    rejected_here = v.next_origin == "correction"
    return RoundTrace(
        index=r.index, position=r.position,
        draft_ids=tuple(tree.tokens[i] for i in order), draft_texts=tuple(token_texts[i] for i in order),
        p_draft=tuple(p_x[i] for i in order), q_draft=tuple(q_x[i] for i in order),
        accept_probs=tuple(tried.get(i, (math.nan, math.nan))[0] for i in order),
        uniforms=tuple(tried.get(i, (math.nan, math.nan))[1] for i in order),
        accepted=tuple(k < len(v.path) for k in range(n)), n_accepted=len(v.path),
        next_id=v.next_token, next_text=texts([v.next_token])[0], next_origin=v.next_origin,
        p_top=top_dist(p[end], top_n, texts),
        q_top=top_dist(tree.q[end], top_n, texts) if rejected_here else None,
        residual_top=top_dist(v.residual.cpu(), top_n, texts),
        draft_ms=draft_ms, verify_ms=verify_ms,
        tree=TreeTrace(nodes, tuple(v.path)),
    )


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
        return TreeSession(self.model, self.config, sampling, vocab_size)
