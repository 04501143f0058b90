"""Speculative and target-only generation, yielding one frozen RoundTrace per round."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import torch

from specviz.core.adaptive import AdaptiveGamma
from specviz.core.drafters import Draft, Drafter
from specviz.core.kv import CachedLM
from specviz.core.sampling import AcceptRule, SamplingConfig, Verdict, logits_to_probs, verify_draft
from specviz.core.trace import Generation, GenerationConfig, RoundTrace, StopReason, TopDist


class TargetProbs(Protocol):
    """Where a run reads the target's p from; the default is a fresh KV cache (anything with the same answers works)."""

    def prefill(self, ids: Sequence[int]) -> None: ...

    def probs(self, ids: Sequence[int], n_last: int) -> torch.Tensor:
        """p (n_last, V) after the run's sampling transform, at the last n_last positions of ids."""
        ...


class CachedTarget:
    """The default TargetProbs: one request's CachedLM, its logits turned into p by logits_to_probs."""

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig) -> None:
        self.lm = CachedLM(model)
        self.sampling = sampling

    def prefill(self, ids: Sequence[int]) -> None:
        self.lm.prefill(ids)

    def probs(self, ids: Sequence[int], n_last: int) -> torch.Tensor:
        return logits_to_probs(self.lm.logits(ids, n_last), self.sampling)  # (n_last, V)


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


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _round_trace(
    index: int, position: int, draft: Draft, p: torch.Tensor, v: Verdict, texts: TokenTexts,
    top_n: int, draft_ms: float, verify_ms: float,
) -> RoundTrace:
    """Pack one round's tensors into plain data (top-n only: tracing must stay cheap)."""
    k, n = len(draft.tokens), v.n_accepted
    idx, toks = torch.arange(k), torch.tensor(draft.tokens, dtype=torch.long)
    rejected = n < k
    return RoundTrace(
        index=index,
        position=position,
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
        p_top=top_dist(p[n], top_n, texts),
        q_top=top_dist(draft.q[n], top_n, texts) if rejected else None,
        residual_top=top_dist(v.residual, top_n, texts),
        draft_ms=draft_ms,
        verify_ms=verify_ms,
    )


def _finish(new_ids: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], StopReason | None]:
    """Cut a round's new ids at EOS (kept) or at the token budget."""
    for i, t in enumerate(new_ids[:budget]):
        if t in eos:
            return new_ids[: i + 1], "eos"
    if len(new_ids) >= budget:
        return new_ids[:budget], "max_new_tokens"
    return new_ids, None


GenIter = Generator[RoundTrace, None, Generation]


def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    gamma_policy: Callable[[Sequence[RoundTrace]], int] | None = None,
    accept_rule: AcceptRule = verify_draft,
    target_probs: TargetProbs | None = None,
) -> GenIter:
    """Draft γ tokens, verify them in one target pass, keep the agreed prefix plus one token.

    Yields a RoundTrace after every round and returns the Generation. Greedy output is
    token-identical to `autoregressive_generate`; sampled output follows the target's p.
    `accept_rule` exists so the "Same answer" lab can swap in a deliberately lossy rule and
    show a test catching it; `target_probs` lets it share memoised target distributions across many
    short samples. Their defaults (the exact rule, a fresh KV cache) are what every run uses.
    """
    if gamma_policy is None and config.adaptive:
        gamma_policy = AdaptiveGamma(max_gamma=config.gamma).new_policy()
    return _generate(target, drafter, tokenizer, prompt_ids, config, eos_ids, gamma_policy, accept_rule, target_probs)


def autoregressive_generate(
    target: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    target_probs: TargetProbs | None = None,
) -> GenIter:
    """The baseline: one target pass per token, same sampling transform and seed semantics.

    It is the speculative loop with nothing ever drafted: each step is a RoundTrace with an
    empty draft and origin "target", and the token comes from the same rule (a bonus from p).
    """
    return _generate(target, None, tokenizer, prompt_ids, config, eos_ids, None, verify_draft, target_probs)


def _generate(
    target: torch.nn.Module,
    drafter: Drafter | None,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int],
    gamma_policy: Callable[[Sequence[RoundTrace]], int] | None,
    accept_rule: AcceptRule,
    target_probs: TargetProbs | None,
) -> GenIter:
    """The one decoding loop behind both public generators (drafter None = target only)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    sampling = config.sampling
    gen = sampling.make_generator(target.device)  # rand/multinomial need it on the tensors' device
    texts = TokenTexts(tokenizer)
    eos = frozenset(eos_ids) if config.stop_at_eos else frozenset()
    vocab = target.config.vocab_size  # p and q must share it
    no_draft = Draft((), torch.zeros(0, vocab))
    ids, rounds = list(prompt_ids), []
    stop: StopReason | None = None

    t0 = time.perf_counter()
    target_p = target_probs if target_probs is not None else CachedTarget(target, sampling)
    target_p.prefill(ids)
    session = drafter.start(ids, sampling, vocab) if drafter else None
    prefill_ms, t_decode = _ms_since(t0), time.perf_counter()

    while stop is None:
        produced = len(ids) - len(prompt_ids)
        budget = config.max_new_tokens - produced
        gamma = gamma_policy(rounds) if gamma_policy else config.gamma
        k_max = max(0, min(gamma, budget - 1)) if session else 0  # never draft past the budget

        t = time.perf_counter()
        draft = session.propose(ids, k_max, gen) if k_max else no_draft
        draft_ms = _ms_since(t) if k_max else 0.0

        t = time.perf_counter()
        p = target_p.probs(ids + list(draft.tokens), len(draft.tokens) + 1)  # (k+1, V)
        verdict = accept_rule(p, draft.q.to(p.device), torch.tensor(draft.tokens, dtype=torch.long, device=p.device), gen)
        verify_ms = _ms_since(t)

        trace = _round_trace(len(rounds), produced, draft, p.cpu(), verdict, texts, config.trace_top_n, draft_ms, verify_ms)
        new_ids, stop = _finish(list(trace.new_ids), budget, eos)
        ids.extend(new_ids)
        rounds.append(trace)
        yield trace

    new = tuple(ids[len(prompt_ids):])
    return Generation(
        kind="speculative" if drafter else "autoregressive", drafter=drafter.name if drafter else "none",
        config=config, prompt_ids=tuple(prompt_ids), tokens=new,
        text=tokenizer.decode(list(new), skip_special_tokens=True), rounds=tuple(rounds),
        prefill_ms=prefill_ms, decode_ms=_ms_since(t_decode), stop_reason=stop,
    )
