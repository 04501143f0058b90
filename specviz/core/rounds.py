"""The round interface: a drafter bound to one run plays each round as a program that asks for model passes (Feeds) and gets logits back.

A round never calls a model. It yields a `Feed` — which ids to score after what the run's own
cache holds — and is resumed with that pass's logits (n, V). Whoever answers decides how: alone
(`solo`), or in one forward with other runs' feeds (`specviz.serve`). Every drafter kind — the
draft model's chain, the n-gram lookup, the token tree, and the target alone — goes through this
one interface (`RoundSession.round`), so the decoding loop knows no drafter kind and no batching.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import torch

from specviz.core import clock
from specviz.core.clock import ms_since
from specviz.core.forward import Feed, forward
from specviz.core.kv import TreeLM
from specviz.core.progress import drain
from specviz.core.sampling import AcceptRule, SamplingConfig, Verdict, logits_to_probs
from specviz.core.trace import RoundTrace, TopDist

R = TypeVar("R")
Steps = Generator[Feed, torch.Tensor, R]  # a program: yields the passes it needs, is sent their logits, returns R


def solo_run(program: Generator[Any, Any, R]) -> Generator[Any, None, R]:
    """Answer a program's passes one at a time, alone: each Feed gets its own forward; anything else it yields
    (a RoundTrace) is passed on. Returns the program's result."""
    answer: torch.Tensor | None = None
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


class TargetProbs(Protocol):
    """Where a run reads the target's p from; the default is the run's own KV cache (anything with the same answers works)."""

    def prefill(self, ids: Sequence[int]) -> Steps[None]: ...

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]:
        """p (n_last, V) after the run's sampling transform, at the last n_last positions of ids."""
        ...


class CachedTarget:
    """The default TargetProbs: the run's own cache of the target (a TreeLM, so it can score trees too), logits turned into p."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig) -> None:
        self.lm = TreeLM(model)
        self.sampling = sampling

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        return self.lm.prefill_steps(ids)

    def probs(self, ids: Sequence[int], n_last: int) -> Steps[torch.Tensor]:
        logits = yield self.lm.feed(ids, n_last)
        return logits_to_probs(logits, self.sampling)  # (n_last, V)

    def tree_probs(self, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int]) -> Steps[torch.Tensor]:
        """p (n+1, V) after the last id and after every tree node, from one target pass."""
        logits = yield self.lm.tree_feed(ids, tokens, parents, with_root=True)
        return logits_to_probs(logits, self.sampling)

    def commit(self, path: Sequence[int]) -> None:
        """Keep the accepted branch of the last scored tree in the cache."""
        self.lm.commit(path)


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


class RoundSession(Protocol):
    """A drafter bound to one run (it owns that run's draft state, e.g. a KV cache): reads the prompt, then plays rounds."""

    def prefill(self, ids: Sequence[int]) -> Steps[None]: ...

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]: ...


class Drafter(Protocol):
    """Stateless factory of round sessions; the loop never looks inside."""

    name: str

    def start(self, prompt_ids: Sequence[int], sampling: SamplingConfig, vocab_size: int) -> RoundSession: ...


class ChainSession(Protocol):
    """A session whose rounds are chains: it proposes up to γ tokens in a row, and `chain_round` does the rest."""

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]: ...


def chain_round(session: ChainSession, r: Round, tools: RunTools) -> Steps[RoundTrace]:
    """Draft up to γ tokens, verify them in one target pass, keep the agreed prefix plus one token, and record it."""
    k_max = max(0, min(r.gamma, r.budget - 1))  # never draft past the budget
    t = clock.now()
    draft = (yield from session.propose_steps(r.ids, k_max, tools.generator)) if k_max else Draft((), torch.zeros(0, tools.vocab))
    draft_ms = ms_since(t) if k_max else 0.0
    t = clock.now()
    p = yield from tools.target.probs(r.ids + draft.tokens, len(draft.tokens) + 1)  # (k+1, V)
    toks = torch.tensor(draft.tokens, dtype=torch.long, device=p.device)
    verdict = tools.rule(p, draft.q.to(p.device), toks, tools.generator)
    verify_ms = ms_since(t)
    return chain_trace(r, draft, p.cpu(), verdict, tools, draft_ms, verify_ms)


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


class TargetAlone:
    """The session of a target-only run: every round is one target step with nothing drafted."""

    name = "none"

    def prefill(self, ids: Sequence[int]) -> Steps[None]:
        yield from ()

    def propose_steps(self, ids: Sequence[int], gamma: int, generator: torch.Generator) -> Steps[Draft]:
        yield from ()
        return Draft((), torch.zeros(0, 0))

    def round(self, r: Round, tools: RunTools) -> Steps[RoundTrace]:
        return chain_round(self, replace(r, gamma=0), tools)
