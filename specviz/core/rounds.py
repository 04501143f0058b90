"""The round interface: a drafter bound to one run plays each round as a program that asks for model passes (Feeds) and gets Passes back.

A round never calls a model. It yields a `Feed` — which ids to score after what the run's own
cache holds, and which hidden states it wants besides the logits — and is resumed with that
pass's answer (a `Pass`). Whoever answers decides how: alone (`solo`), or in one forward with
other runs' feeds (`specviz.serve`). A round is a chain round (`chain_round`: any proposer of a
row of tokens) or a tree round (`tree_round`: any proposer of a tree), the two read top to bottom
side by side below: draft, one target pass, the acceptance rule, the cache rolled back to what was
kept, the session told, the round recorded. After the prefill and after
every round the run's drafter session hears what the target settled (`Kept`: the verdict and the
target's hidden states at the kept positions). So the decoding loop knows no drafter kind and no
batching, and a new drafter is a session with a proposer (see `specviz.core.drafters`).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import torch

from specviz.core import clock, drafters, profile
from specviz.core.clock import ms_since
from specviz.core.forward import Feed, Pass, forward
from specviz.core.kv import TreeLM
from specviz.core.progress import drain
from specviz.core.sampling import AcceptRule, SamplingConfig, Verdict, logits_to_probs
from specviz.core.trace import RoundTrace, TopDist, TreeNode, TreeTrace
from specviz.core.tree_rule import DraftTree, TreeVerdict, verify_tree

R = TypeVar("R")
Steps = Generator[Feed, Pass, R]  # a program: yields the passes it needs, is sent their answers, returns R


def solo_run(program: Generator[Any, Any, R]) -> Generator[Any, None, R]:
    """Answer a program's passes one at a time, alone: each Feed gets its own forward; anything else it yields
    (a RoundTrace) is passed on. Returns the program's result."""
    answer: Pass | None = None
    while True:
        try:
            item = program.send(answer)
        except StopIteration as done:
            return done.value
        if isinstance(item, Feed):
            answer = forward(item.model, [item])[0]
        else:
            answer = None
            yield item


def solo(steps: Steps[R]) -> R:
    """A program's result, its passes answered alone (for programs that yield nothing but passes)."""
    return drain(solo_run(steps))


@dataclass(frozen=True)
class Draft:
    """A drafter's proposal: the new tokens only, and always their full q rows."""

    tokens: tuple[int, ...]  # (k,) with k <= γ; k may be 0 (nothing worth drafting)
    q: torch.Tensor  # (k, V) the draft distribution each token was drawn from


class TokenTexts:
    """Decodes single ids for traces, memoised per request (cheap repeated lookups)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.memo: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> tuple[str, ...]:
        missing = [i for i in dict.fromkeys(ids) if i not in self.memo]
        if missing:
            for i, text in zip(missing, self.tokenizer.batch_decode([[i] for i in missing])):
                self.memo[i] = text
        return tuple(self.memo[i] for i in ids)


def top_dist(probs: torch.Tensor, n: int, texts: TokenTexts) -> TopDist:
    """Top-n entries of a (V,) distribution, zero entries dropped."""
    values, ids = torch.topk(probs, min(n, probs.shape[-1]))
    keep = values > 0
    ids_l, vals_l = ids[keep].tolist(), values[keep].tolist()
    return TopDist(tuple(ids_l), tuple(vals_l), texts(ids_l))


@dataclass(frozen=True, eq=False)
class Scored:
    """The target's answer to one scoring pass: p at the asked rows, and the hidden states the run asked for at the same rows."""

    p: torch.Tensor  # (n, V) after the run's sampling transform
    hidden: tuple[torch.Tensor, ...] = ()  # one (n, d) per asked layer; () when none was asked


class TargetProbs(Protocol):
    """Where a run reads the target from; the default is the run's own KV cache (anything with the same answers works)."""

    def prefill(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Steps[tuple[torch.Tensor, ...]]:
        """Cache every id but the last; the asked layers' hidden states (len(ids) - 1, d) at those positions, or ()."""
        ...

    def probs(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = ()) -> Steps[Scored]:
        """p (n_last, V) at the last n_last positions of ids (and the asked hidden states there)."""
        ...

    def tree_probs(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   layers: tuple[int, ...] = ()) -> Steps[Scored]:
        """p (n+1, V) after the last id and after every node of a tree (parents: -1 = the last id), from one pass."""
        ...

    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted branch (node indices, root to leaf) of the last scored tree; drop the other nodes."""
        ...


class CachedTarget:
    """The default TargetProbs: the run's own cache of the target (a TreeLM, so it can score trees too), logits turned into p."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig) -> None:
        self.lm = TreeLM(model)
        self.sampling = sampling

    def prefill(self, ids: Sequence[int], layers: tuple[int, ...] = ()) -> Steps[tuple[torch.Tensor, ...]]:
        answer = yield from self.lm.prefill_steps(ids, layers)
        return answer.hidden if answer is not None else ()

    def probs(self, ids: Sequence[int], n_last: int, layers: tuple[int, ...] = ()) -> Steps[Scored]:
        answer = yield self.lm.feed(ids, n_last, layers)
        return _scored(answer, self.sampling)  # (n_last, V)

    def tree_probs(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   layers: tuple[int, ...] = ()) -> Steps[Scored]:
        answer = yield self.lm.tree_feed(ids, tokens, parents, with_root=True, layers=layers)
        return _scored(answer, self.sampling)

    def commit(self, path: Sequence[int]) -> None:
        self.lm.commit(path)


def _scored(answer: Pass, sampling: SamplingConfig) -> Scored:
    """A target pass's logits as p (the run's sampling transform over the whole vocabulary), lapped for a profile."""
    laps = profile.laps()
    laps.mark()
    scored = Scored(logits_to_probs(answer.logits, sampling), answer.hidden)
    laps("target's p (softmax over the vocabulary)", role="verify")
    return scored


@dataclass(frozen=True, eq=False)
class Kept:
    """What the target settled, told to the run's drafter session after the prefill and after every round.

    `hidden` holds the target's features at the positions whose tokens are settled and whose rows
    the target has now computed: after the prefill every prompt position but the last; after a
    round the position before the draft and each accepted one (accepted + 1 rows). The correction
    or bonus token has no row yet: the next round's first row is its.
    """

    ids: tuple[int, ...]  # the run's ids now: the prompt and every kept token, this round's correction or bonus included
    start: int  # the position of hidden's first row
    drafted: int  # tokens proposed this round (a tree: its nodes); 0 after the prefill
    accepted: int  # of them, kept
    path: tuple[int, ...]  # the kept proposals' indices (a chain: 0..accepted-1; a tree: its nodes, root to leaf)
    next_token: int | None  # the target's own token (None after the prefill)
    next_origin: str | None  # "correction", "bonus" or "target"
    hidden: tuple[torch.Tensor, ...] = ()  # one (rows, d) per layer the session asked for; () when it asked none


@dataclass(frozen=True)
class Round:
    """What the loop asks of one round (plain values)."""

    ids: tuple[int, ...]  # prompt and every token kept so far
    index: int  # 0-based round number
    position: int  # new tokens generated before this round
    gamma: int  # tokens to draft at most (the policy's choice; 0 = the target alone)
    budget: int  # new tokens still allowed: nothing may be drafted past budget - 1


@dataclass(frozen=True)
class RunTools:
    """What every round of one run shares: the target's p, the rule, the run's random generator, how traces are written."""

    target: TargetProbs
    rule: AcceptRule
    generator: torch.Generator
    texts: TokenTexts
    top_n: int  # entries of p, q and the residual kept per round
    vocab: int  # the target's vocabulary: q rows are fitted to it


class Session:
    """A drafter bound to one run, the one kind of session: it owns that run's draft state (e.g. a KV cache), reads the
    prompt (`prefill`), plays each round (`round`) and hears each verdict (`hear`).

    A chain drafter writes `propose_steps` (up to γ tokens in a row) and its rounds are chain rounds, the default; a
    tree drafter writes `propose_tree_steps` and plays `tree_round` in its `round`. `features` names the target's
    hidden-state layers (transformers' indices) it wants in every `Kept`; () = none. Override what you need.
    """

    features: tuple[int, ...] = ()

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from ()

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return chain_round(self, r, tools)

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        raise NotImplementedError("a chain drafter's session writes propose_steps")

    def propose_tree_steps(self, ids: Sequence[int], max_depth: int, generator: torch.Generator) -> Steps[DraftTree]:
        raise NotImplementedError("a tree drafter's session writes propose_tree_steps")

    def propose(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Draft:
        """`propose_steps` answered alone (tests and tools that draft outside a run)."""
        return solo(self.propose_steps(ids, gamma, generator))

    def hear(self, kept: Kept) -> None:
        pass


class Drafter(Protocol):
    """Stateless factory of sessions, one per run; the loop never looks inside."""

    name: str

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> Session: ...


def chain_round(session: Session, r: Round, tools: RunTools) -> Steps[RoundTrace]:
    """Draft up to γ tokens, verify them in one target pass, keep the agreed prefix plus one token, tell the session, record it."""
    k_max = max(0, min(r.gamma, r.budget - 1))  # never draft past the budget
    t = clock.now()
    draft = (yield from session.propose_steps(r.ids, k_max, tools.generator)) if k_max else Draft((), torch.zeros(0, tools.vocab))
    draft_ms = ms_since(t) if k_max else 0.0
    t = clock.now()
    k = len(draft.tokens)
    scored = yield from tools.target.probs(r.ids + draft.tokens, k + 1, session.features)  # p (k+1, V)
    p = scored.p
    laps = profile.laps()
    laps.mark()
    toks = torch.tensor(draft.tokens, dtype=torch.long, device=p.device)
    verdict = tools.rule(p, draft.q.to(p.device), toks, tools.generator)
    laps("acceptance rule")
    verify_ms = ms_since(t)
    n = verdict.n_accepted
    # the cache rolls back by itself: the next round's feed is r.ids + the n kept + the target's token, and the
    # target's cache keeps only the entries it still shares with that (kv.CachedLM.feed); the rejected ones go
    session.hear(Kept(ids=r.ids + draft.tokens[:n] + (verdict.next_token,), start=len(r.ids) - 1, drafted=k, accepted=n,
                      path=tuple(range(n)), next_token=verdict.next_token,
                      next_origin=verdict.next_origin if k else "target",
                      hidden=tuple(h[: n + 1] for h in scored.hidden)))
    laps("the drafter hears the verdict")
    trace = chain_trace(r, draft, p.cpu(), verdict, tools, draft_ms, verify_ms)
    laps("the round's trace")
    return trace


def tree_round(proposer: Session, r: Round, tools: RunTools) -> Steps[RoundTrace]:
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
    tools.target.commit(verdict.path)  # the cache rolled back: only the accepted branch's entries stay
    verify_ms = ms_since(t)
    rows = torch.tensor([0] + [1 + i for i in verdict.path], dtype=torch.long)  # the root's row and the kept nodes' rows
    proposer.hear(Kept(ids=r.ids + tuple(tree.tokens[i] for i in verdict.path) + (verdict.next_token,),
                       start=len(r.ids) - 1, drafted=len(tree.tokens), accepted=len(verdict.path), path=verdict.path,
                       next_token=verdict.next_token, next_origin=verdict.next_origin,
                       hidden=tuple(h[rows.to(h.device)] for h in scored.hidden)))
    return tree_round_trace(r, tree, scored.p.cpu(), verdict, tools, draft_ms, verify_ms)


def chain_trace(r: Round, draft: Draft, p: torch.Tensor, v: Verdict, tools: RunTools, draft_ms: float,
                verify_ms: float) -> RoundTrace:
    """Pack one chain round's tensors into plain data (top-n only: tracing must stay cheap)."""
    k, n, texts = len(draft.tokens), v.n_accepted, tools.texts
    idx, toks = torch.arange(k), torch.tensor(draft.tokens, dtype=torch.long)
    rejected = n < k
    p_top = top_dist(p[n], tools.top_n, texts)
    return RoundTrace(
        index=r.index,
        position=r.position,
        draft_ids=draft.tokens,
        draft_texts=texts(draft.tokens),
        p_draft=tuple(p[idx, toks].tolist()) if k else (),
        q_draft=tuple(draft.q[idx, toks].tolist()) if k else (),
        accept_probs=v.accept_probs,
        uniforms=v.uniforms,
        accepted=tuple(i < n for i in range(k)),
        n_accepted=n,
        next_id=v.next_token,
        next_text=texts([v.next_token])[0],
        next_origin=v.next_origin if k else "target",
        p_top=p_top,
        q_top=top_dist(draft.q[n], tools.top_n, texts) if rejected else None,
        # a bonus (and every target-only step) is drawn from p itself: its top entries are p's, found once
        residual_top=p_top if v.next_origin == "bonus" else top_dist(v.residual, tools.top_n, texts),
        draft_ms=draft_ms,
        verify_ms=verify_ms,
    )


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


class _NothingDrafted(Session):
    """A tree proposer seen as a chain proposer of nothing (a round with γ 0 still tells it the verdict)."""

    def __init__(self, proposer: Session) -> None:
        self.proposer = proposer
        self.features = proposer.features

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        raise AssertionError("a round with γ 0 drafts nothing")

    def hear(self, kept: Kept) -> None:
        self.proposer.hear(kept)


class TargetAlone(Session):
    """The session of a target-only run: every round is one target step with nothing drafted."""

    name = drafters.NONE

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()
        return Draft((), torch.zeros(0, 0))

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return chain_round(self, replace(r, gamma=0), tools)
