"""One tree round of the engine: draft a tree, verify it in one target pass, keep the accepted branch, record it."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from specviz.core.engine import CachedTarget, TokenTexts, top_dist
from specviz.core.sampling import SamplingConfig, logits_to_probs
from specviz.core.trace import RoundTrace, TreeNode, TreeTrace
from specviz.core.tree import DraftTree, TreeLM, TreeSession
from specviz.core.tree_rule import TreeVerdict, verify_tree


class TreeTarget(CachedTarget):
    """CachedTarget over a TreeLM: answers plain questions as before, and scores whole trees."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig) -> None:
        self.lm = TreeLM(model)
        self.sampling = sampling

    def tree_probs(self, ids: Sequence[int], tree: DraftTree) -> torch.Tensor:
        """p (n+1, V) after the last id and after every node, from one target pass."""
        return logits_to_probs(self.lm.tree_logits(ids, tree.tokens, tree.parents, with_root=True), self.sampling)


def tree_round(
    session: TreeSession, target: TreeTarget, ids: Sequence[int], max_depth: int, generator: torch.Generator,
    texts: TokenTexts, top_n: int, index: int, position: int,
) -> RoundTrace:
    """Draft, verify in one pass, keep the accepted branch in both caches (gathered), and pack the record."""
    t = time.perf_counter()
    tree = session.propose_tree(ids, max_depth, generator)
    draft_ms = (time.perf_counter() - t) * 1000.0
    t = time.perf_counter()
    p = target.tree_probs(ids, tree)  # (n+1, V)
    verdict = verify_tree(p, tree, generator)
    target.lm.commit(verdict.path)
    session.commit(verdict.path)
    verify_ms = (time.perf_counter() - t) * 1000.0
    return tree_round_trace(index, position, tree, p.cpu(), verdict, texts, top_n, draft_ms, verify_ms)


def tree_round_trace(
    index: int, position: int, tree: DraftTree, p: torch.Tensor, v: TreeVerdict, texts: TokenTexts,
    top_n: int, draft_ms: float, verify_ms: float,
) -> RoundTrace:
    """A RoundTrace whose `tree` holds every node; its chain fields list the accepted path, then the rest."""
    n = len(tree.tokens)
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
        index=index, position=position,
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
