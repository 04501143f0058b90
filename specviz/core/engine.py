"""The decoding loop: a run is a program of rounds that asks for model passes; `speculative_generate` and `autoregressive_generate` answer them alone.

`run_program` is only the loop: it prefills (and tells the session what the target settled), asks
the policy for γ, lets the run's session play a round (`Session.round`, whatever the drafter),
cuts at EOS or the budget, and yields each RoundTrace. The passes it needs come out of it as Feeds; `rounds.solo_run` answers them one by one,
and `specviz.serve` answers many runs' feeds in one forward. Both give each run the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import torch

from specviz.core.adaptive import AdaptiveGamma
from specviz.core.forward import Feed, Pass
from specviz.core import clock, drafters, profile
from specviz.core.clock import ms_since
from specviz.core.rounds import CachedTarget, Drafter, Kept, Round, RunTools, TargetAlone, TargetProbs, TokenTexts, solo_run
from specviz.core.sampling import AcceptRule, verify_draft
from specviz.core.trace import Generation, GenerationConfig, RoundTrace, StopReason

GenIter = Generator[RoundTrace, None, Generation]
Program = Generator[Feed | RoundTrace, Pass | None, Generation]  # yields passes (sent their answers) and rounds (sent None)
GammaPolicy = Callable[[Sequence[RoundTrace]], int]


def _finish(new_ids: list[int], budget: int, eos: frozenset[int]) -> tuple[list[int], StopReason | None]:
    """Cut a round's new ids at EOS (kept) or at the token budget."""
    for i, t in enumerate(new_ids[:budget]):
        if t in eos:
            return new_ids[: i + 1], "eos"
    if len(new_ids) >= budget:
        return new_ids[:budget], "max_new_tokens"
    return new_ids, None


def speculative_program(
    target: torch.nn.Module,
    drafter: Drafter,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    gamma_policy: GammaPolicy | None = None,
    accept_rule: AcceptRule = verify_draft,
    target_probs: TargetProbs | None = None,
) -> Program:
    """A speculative run as a program (passes out, logits in): draft, verify in one target pass, keep the agreed prefix plus one."""
    if gamma_policy is None and config.adaptive:
        gamma_policy = AdaptiveGamma(max_gamma=config.gamma).new_policy()
    return run_program(target, drafter, tokenizer, prompt_ids, config, eos_ids, gamma_policy, accept_rule, target_probs)


def autoregressive_program(
    target: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    target_probs: TargetProbs | None = None,
) -> Program:
    """The baseline as a program: one target pass per token, same sampling transform and seed semantics."""
    return run_program(target, None, tokenizer, prompt_ids, config, eos_ids, None, verify_draft, target_probs)


def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    gamma_policy: GammaPolicy | None = None,
    accept_rule: AcceptRule = verify_draft,
    target_probs: TargetProbs | None = None,
) -> GenIter:
    """Draft γ tokens, verify them in one target pass, keep the agreed prefix plus one token (this run alone).

    Yields a RoundTrace after every round and returns the Generation. Greedy output is
    token-identical to `autoregressive_generate`; sampled output follows the target's p.
    `accept_rule` exists so the "Same answer" lab can swap in a deliberately lossy rule and
    show a test catching it; `target_probs` lets it share memoised target distributions across many
    short samples. Their defaults (the exact rule, the run's own KV cache) are what every run uses.
    """
    return solo_run(speculative_program(target, drafter, tokenizer, prompt_ids, config, eos_ids, gamma_policy,
                                        accept_rule, target_probs))


def autoregressive_generate(
    target: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int] = (),
    target_probs: TargetProbs | None = None,
) -> GenIter:
    """The baseline, alone: one target pass per token, same sampling transform and seed semantics.

    It is the speculative loop with nothing ever drafted: each step is a RoundTrace with an
    empty draft and origin "target", and the token comes from the same rule (a bonus from p).
    """
    return solo_run(autoregressive_program(target, tokenizer, prompt_ids, config, eos_ids, target_probs))


def run_program(
    target: torch.nn.Module,
    drafter: Drafter | None,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    eos_ids: Sequence[int],
    gamma_policy: GammaPolicy | None,
    accept_rule: AcceptRule,
    target_probs: TargetProbs | None,
) -> Program:
    """The one decoding loop behind every run (drafter None = target only)."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    sampling = config.sampling
    vocab = target.config.vocab_size  # p and q must share it
    tools = RunTools(
        target=target_probs if target_probs is not None else CachedTarget(target, sampling),
        rule=accept_rule,
        generator=sampling.make_generator(target.device),  # rand/multinomial need it on the tensors' device
        texts=TokenTexts(tokenizer),
        top_n=config.trace_top_n,
        vocab=vocab,
    )
    eos = frozenset(eos_ids) if config.stop_at_eos else frozenset()
    session = drafter.start(prompt_ids, sampling, vocab) if drafter else TargetAlone()
    ids, rounds = list(prompt_ids), []
    stop: StopReason | None = None

    t0 = clock.now()
    hidden = yield from tools.target.prefill(ids, session.features)
    session.hear(Kept(ids=tuple(ids), start=0, drafted=0, accepted=0, path=(), next_token=None, next_origin=None,
                      hidden=hidden))
    yield from session.prefill(ids)
    profile.laps().reset()  # a round profile counts the rounds, not the prefill
    prefill_ms, t_decode = ms_since(t0), clock.now()

    while stop is None:
        produced = len(ids) - len(prompt_ids)
        budget = config.max_new_tokens - produced
        gamma = gamma_policy(rounds) if gamma_policy else config.gamma
        trace = yield from session.round(Round(tuple(ids), len(rounds), produced, gamma, budget), tools)
        new_ids, stop = _finish(list(trace.new_ids), budget, eos)
        ids.extend(new_ids)
        rounds.append(trace)
        yield trace

    new = tuple(ids[len(prompt_ids):])
    return Generation(
        kind="speculative" if drafter else "autoregressive", drafter=drafter.name if drafter else drafters.NONE,
        config=config, prompt_ids=tuple(prompt_ids), tokens=new,
        text=tokenizer.decode(list(new), skip_special_tokens=True), rounds=tuple(rounds),
        prefill_ms=prefill_ms, decode_ms=ms_since(t_decode), stop_reason=stop,
    )
