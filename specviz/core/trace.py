"""What a run is asked (GenerationConfig) and what it records: one frozen RoundTrace per round (with its TreeTrace
in tree rounds), one Generation per run.

These records are plain CPU data; every view, metric and export reads them and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specviz.core.limits import DEFAULT_GAMMA, check_gamma, check_max_new_tokens
from specviz.core.sampling import SamplingConfig

NextOrigin = Literal["correction", "bonus", "target"]
StopReason = Literal["eos", "max_new_tokens"]


MEMORY_HELPER = "memory"  # a round's `helper`: the hybrid's memory drafted it
MODEL_HELPER = "model"  # a round's `helper`: the hybrid's draft model drafted it


@dataclass(frozen=True)
class GenerationConfig:
    """One run's settings; frozen so it doubles as a cache key."""

    max_new_tokens: int = 64  # stop after this many new tokens (EOS may stop earlier)
    gamma: int = DEFAULT_GAMMA  # draft length γ: tokens the drafter proposes per round (the ceiling when adaptive)
    adaptive: bool = False  # let AdaptiveGamma pick 0..γ each round from measured throughput
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # same transform for p and q
    trace_top_n: int = 20  # keep only this many entries of p, q and the residual per round
    stop_at_eos: bool = True  # stop at the tokenizer's end ids

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_max_new_tokens(self.max_new_tokens)


@dataclass(frozen=True)
class TopDist:
    """The top entries of one distribution over the vocabulary."""

    ids: tuple[int, ...]
    probs: tuple[float, ...]
    texts: tuple[str, ...]


NodeVerdict = Literal["accepted", "rejected", "unreached"]


@dataclass(frozen=True)
class TreeNode:
    """One drafted node of a token tree and what the target made of it."""

    token: int
    text: str
    parent: int  # index of the parent node in TreeTrace.nodes; -1 = the round's root (the last token before it)
    depth: int  # 1 for the root's children
    p: float  # target p(token) at the parent (before any sibling was tried)
    q: float  # draft q(token) at the parent
    sampled: bool  # drawn from q (tried first, with min(1, p/q)) or a deterministic pick (tried as a one-hot draft)
    accept_prob: float | None  # the probability it was accepted with; None when never tried
    uniform: float | None  # the u drawn for it; None when never tried
    verdict: NodeVerdict  # accepted / rejected / never reached (an earlier sibling or an ancestor decided first)


@dataclass(frozen=True)
class TreeTrace:
    """A whole drafted tree: nodes with parents before children, siblings in the order they were tried."""

    nodes: tuple[TreeNode, ...]
    path: tuple[int, ...]  # accepted node indices, root to leaf


@dataclass(frozen=True)
class RoundTrace:
    """Everything one round decided, as plain CPU data (the views only read these)."""

    index: int  # 0-based round number
    position: int  # new tokens generated before this round
    draft_ids: tuple[int, ...]  # what the drafter proposed (empty for target-only steps)
    draft_texts: tuple[str, ...]
    p_draft: tuple[float, ...]  # target probability p_i(x_i) of each drafted token
    q_draft: tuple[float, ...]  # draft probability q_i(x_i) of each drafted token
    accept_probs: tuple[float, ...]  # min(1, p_i/q_i)
    uniforms: tuple[float, ...]  # u_i drawn; token i accepted while u_i < accept_probs[i]
    accepted: tuple[bool, ...]  # per drafted token: part of the accepted prefix
    n_accepted: int
    next_id: int  # the target's own token: a correction, a bonus, or a plain target step
    next_text: str
    next_origin: NextOrigin
    p_top: TopDist | None  # target p at the decision position (first rejection, or bonus)
    q_top: TopDist | None  # draft q there (None for a bonus or a target-only step)
    residual_top: TopDist | None  # what next_id was drawn from: norm(max(0, p-q)) or p
    draft_ms: float
    verify_ms: float  # target forward + acceptance rule
    # tree rounds only: the whole tree. The chain fields above then list the accepted path first and
    # the other nodes after it (accept_probs/uniforms are nan for nodes never tried).
    tree: TreeTrace | None = None
    # drafters with more than one helper (the hybrid) say which one drafted this round: MEMORY_HELPER or MODEL_HELPER
    helper: str = ""
    # a memory draft: where its match was found (a key of memory.SOURCE_WORDS) and how many tokens it matched
    memory_source: str = ""
    match_length: int = 0

    @property
    def new_ids(self) -> tuple[int, ...]:
        return self.draft_ids[: self.n_accepted] + (self.next_id,)


@dataclass(frozen=True)
class Generation:
    """A whole run: the new tokens, their text, every round and the totals."""

    kind: Literal["speculative", "autoregressive"]
    drafter: str  # a drafter registry name, or drafters.NONE for the target alone
    config: GenerationConfig
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]  # new ids, EOS included when it stopped the run
    text: str  # decoded new text, special tokens skipped
    rounds: tuple[RoundTrace, ...]
    prefill_ms: float  # both models reading the prompt (not counted per token)
    decode_ms: float  # wall time of all rounds
    stop_reason: StopReason

    @property
    def target_calls(self) -> int:
        return len(self.rounds)

    @property
    def drafted(self) -> int:
        return sum(len(r.draft_ids) for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.n_accepted for r in self.rounds)

    @property
    def ms_per_token(self) -> float:
        return self.decode_ms / max(1, len(self.tokens))
