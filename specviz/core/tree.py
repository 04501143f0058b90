"""The tree round beside the chain round: any proposer drafts a tree, the target verifies it in one pass, both keep the accepted branch.

A tree round drafts several alternative continuations at once; the target scores every node in
one pass where each node sees the committed prefix and its own ancestors only (a 4-D mask and
position id = prefix length + depth). After the verdict the target's cache keeps only the
accepted branch, gathered from the entries already computed (nothing is recomputed), and the
proposer hears the verdict (`Kept.path`) to do the same with its own state. Any proposer works:
the draft model's tree (`core.drafters.tree`), or any chain proposer as a one-branch tree
(`ChainAsTree`: a chain is the tree with one child per node).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import torch

from specviz.core import clock
from specviz.core.clock import ms_since
from specviz.core.rounds import ChainSession, Draft, Kept, Round, RunTools, Session, Steps, chain_round, top_dist
from specviz.core.trace import RoundTrace, TreeNode, TreeTrace
from specviz.core.tree_rule import DraftTree, TreeVerdict, verify_tree


class TreeProposer(Protocol):
    """What a tree round asks of a session: a tree after the run's ids, at most max_depth levels deep; and to hear the verdict."""

    features: tuple[int, ...]

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]: ...

    def hear(self, kept: Kept) -> None: ...


def tree_round(proposer: TreeProposer, r: Round, tools: RunTools) -> Steps[RoundTrace]:
    """Draft a tree, verify it in one target pass, keep the accepted branch plus one token, tell the proposer, record it.

    A round that may draft nothing (γ 0 from the policy, or one token of budget left) is a plain target step.
    The tree's depth is bounded by the budget, not by γ: its size is the proposer's own (a budget of nodes).
    """
    if not min(r.gamma, r.budget - 1):
        return (yield from chain_round(_NothingDrafted(proposer), replace(r, gamma=0), tools))
    t = clock.now()
    tree = yield from proposer.propose_tree_steps(r.ids, r.budget - 1, tools.generator)
    draft_ms = ms_since(t)
    t = clock.now()
    scored = yield from tools.target.tree_probs(r.ids, tree.tokens, tree.parents, proposer.features)  # p (n+1, V)
    verdict = verify_tree(scored.p, tree, tools.generator)
    tools.target.commit(verdict.path)
    verify_ms = ms_since(t)
    rows = torch.tensor([0] + [1 + i for i in verdict.path], dtype=torch.long)  # the root's row and the kept nodes' rows
    proposer.hear(Kept(ids=r.ids + tuple(tree.tokens[i] for i in verdict.path) + (verdict.next_token,),
                       start=len(r.ids) - 1, drafted=len(tree.tokens), accepted=len(verdict.path), path=verdict.path,
                       next_token=verdict.next_token, next_origin=verdict.next_origin,
                       hidden=tuple(h[rows.to(h.device)] for h in scored.hidden)))
    return tree_round_trace(r, tree, scored.p.cpu(), verdict, tools, draft_ms, verify_ms)


class _NothingDrafted:
    """A tree proposer seen as a chain proposer of nothing (a round with γ 0 still tells it the verdict)."""

    def __init__(self, proposer: TreeProposer) -> None:
        self.proposer = proposer
        self.features = proposer.features

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        raise AssertionError("a round with γ 0 drafts nothing")

    def hear(self, kept: Kept) -> None:
        self.proposer.hear(kept)


def chain_tree(draft: Draft) -> DraftTree:
    """A chain as the tree with one child per node: node i hangs under node i-1, drawn from q row i (as a chain's token is)."""
    k = len(draft.tokens)
    q = torch.cat([draft.q, torch.zeros(1, draft.q.shape[-1])]) if k else torch.zeros(1, draft.q.shape[-1])  # (k+1, V)
    return DraftTree(tokens=draft.tokens, parents=tuple(range(-1, k - 1)), sampled=(True,) * k, q=q)


class ChainAsTree(Session):
    """Any chain proposer played as tree rounds (a one-branch tree of at most `gamma` nodes): the tree round takes every proposer."""

    def __init__(self, chain: ChainSession, gamma: int) -> None:
        self.chain = chain
        self.gamma = gamma
        self.features = chain.features

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        return self.chain.prefill(ids)

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        draft = yield from self.chain.propose_steps(ids, min(self.gamma, max_depth), generator)
        return chain_tree(draft)

    def hear(self, kept: Kept) -> None:
        self.chain.hear(kept)

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return tree_round(self, r, tools)


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


