"""Trees from any proposer: a chain played as a one-branch tree (`ChainAsTree`); the tree round itself is
`rounds.tree_round`, beside the chain round.

A tree round drafts several alternative continuations at once; the target scores every node in
one pass where each node sees the committed prefix and its own ancestors only (a 4-D mask and
position id = prefix length + depth). After the verdict the target's cache keeps only the
accepted branch, gathered from the entries already computed (nothing is recomputed), and the
proposer hears the verdict (`Kept.path`) to do the same with its own state. Any proposer works:
the draft model's tree (`core.drafters.tree`), or any chain proposer as a one-branch tree
(`ChainAsTree`: a chain is the tree with one child per node).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specviz.core.rounds import Draft, Kept, Round, RunTools, Session, Steps, tree_round
from specviz.core.trace import RoundTrace
from specviz.core.tree_rule import DraftTree


def chain_tree(draft: Draft) -> DraftTree:
    """A chain as the tree with one child per node: node i hangs under node i-1, drawn from q row i (as a chain's token is)."""
    k = len(draft.tokens)
    q = torch.cat([draft.q, torch.zeros(1, draft.q.shape[-1])]) if k else torch.zeros(1, draft.q.shape[-1])  # (k+1, V)
    return DraftTree(tokens=draft.tokens, parents=tuple(range(-1, k - 1)), sampled=(True,) * k, q=q)


class ChainAsTree(Session):
    """Any chain proposer played as tree rounds (a one-branch tree of at most `gamma` nodes): the tree round takes every proposer."""

    def __init__(self, chain: Session, gamma: int) -> None:
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


