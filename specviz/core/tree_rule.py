"""The exact acceptance rule on a token tree: one walk from the root, lossless in greedy and sampling mode.

Letters as in sampling.verify_draft: `p` is always the TARGET, `q` always the DRAFT.
At each node the children are tried in order against the current target law, starting from p:
- a child drawn from q (the first child in sampling mode) is accepted with min(1, p(x)/q(x));
  after a rejection p <- norm(max(0, p - q)) (SpecInfer's multi-step speculative sampling);
- a deterministic child (the draft's next best picks, every child in greedy mode) is a one-hot
  draft: accepted with probability p(x); after a rejection p(x) <- 0 and p is renormalised.
An accepted child becomes the node and the walk goes on with the target's p after it; when no
child is accepted the target's token is drawn from what is left of p (a correction), and at a
leaf from p itself (a bonus). Each step outputs exactly the law it was given, whatever token
was tried, so the round's output follows p. Greedy p is one-hot: the walk then simply follows
the target's argmax while a child matches it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.core.sampling import Origin, sample_from


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


@dataclass(frozen=True)
class TreeVerdict:
    """What the target decided about a tree; plain CPU data except `residual`."""

    path: tuple[int, ...]  # accepted node indices, root to leaf
    next_token: int  # the target's own token after the path
    next_origin: Origin  # "correction" (children tried, none accepted) or "bonus" (the path ends at a leaf)
    tried: tuple[int, ...]  # node indices in the order they were tried
    accept_probs: tuple[float, ...]  # the probability each tried node was accepted with
    uniforms: tuple[float, ...]  # u drawn for each tried node; accepted when u < accept prob
    residual: torch.Tensor  # (V,) the law next_token was drawn from


def child_step(p: torch.Tensor, q: torch.Tensor, x: int, sampled: bool) -> tuple[float, torch.Tensor]:
    """Try one child x against the current target law p (V,): its accept probability, and p after a rejection."""
    if sampled:
        accept = min(1.0, float(p[x] / q[x])) if q[x] > 0 else 0.0
        rest = (p - q).clamp_min(0.0)  # (V,)
    else:
        accept = min(1.0, float(p[x]))
        rest = p.clone()
        rest[x] = 0.0
    total = rest.sum()
    # nothing left means the rejection had probability ~0 (p == q, or p(x) == 1): keep p
    return accept, (rest / total if total > 1e-12 else p)


def walk_tree(p: torch.Tensor, tree: DraftTree, uniform: Callable[[], float]) -> tuple[list[int], list[int], list[float], list[float], torch.Tensor]:
    """The rule's walk, given a source of uniforms: (path, tried, accept probs, uniforms, law left at the end).

    p: (n+1, V) target law after the root (row 0) and after each node (row i+1).
    """
    q = tree.q.to(p.device)  # (n+1, V)
    path, tried, accepts, us = [], [], [], []
    node, law = -1, p[0]
    while True:
        kids = tree.children(node)
        if any(tree.sampled[c] for c in kids[1:]):
            raise ValueError("a child drawn from q must be its parent's first child (SpecInfer's proof needs the untouched p)")
        for c in kids:
            accept, rest = child_step(law, q[node + 1], tree.tokens[c], tree.sampled[c])
            u = uniform()
            tried.append(c), accepts.append(accept), us.append(u)
            if u < accept:
                path.append(c)
                node, law = c, p[c + 1]
                break
            law = rest
        else:
            return path, tried, accepts, us, law


def verify_tree(p: torch.Tensor, tree: DraftTree, generator: torch.Generator) -> TreeVerdict:
    """The exact rule on a tree (see the module docstring); uniforms come from `generator` and are recorded."""
    path, tried, accepts, us, law = walk_tree(p, tree, lambda: float(torch.rand((), generator=generator, device=p.device)))
    end = path[-1] if path else -1
    origin: Origin = "correction" if tree.children(end) else "bonus"
    return TreeVerdict(tuple(path), sample_from(law, generator), origin, tuple(tried), tuple(accepts), tuple(us), law)
