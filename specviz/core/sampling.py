"""Logits -> probabilities (temperature, top-k, top-p) and the acceptance rules.

`verify_draft` is THE rule (exact: the output follows the target's law). `TopKShortcut` is a
deliberately WRONG rule, kept beside it only so the Same answer lab can show a test catching it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from specviz.core.limits import check_sampling

Mode = Literal["greedy", "sample"]
Origin = Literal["correction", "bonus"]


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen; applied identically to target and draft (a cache key too)."""

    mode: Mode = "greedy"  # greedy = argmax (one-hot p and q); sample = draw from the tempered p
    temperature: float = 1.0  # divides the logits in sample mode; must be > 0
    top_k: int = 0  # keep only the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 keeps all
    seed: int = 0  # seeds the torch.Generator of one request; uniforms are recorded for replay

    def __post_init__(self) -> None:
        check_sampling(self.mode, self.temperature, self.top_p, self.top_k)

    @property
    def greedy(self) -> bool:
        return self.mode == "greedy"

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A fresh generator for one request: never the global RNG (models are shared)."""
        return torch.Generator(device=device).manual_seed(self.seed)


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Turn raw logits (..., V) into the distribution the rule sees (..., V), float32.

    Greedy gives a one-hot at the argmax, so the acceptance rule below reduces to
    "accept if the draft's token is the target's argmax".
    """
    logits = logits.float()
    if cfg.greedy:
        probs = torch.zeros_like(logits)
        return probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        logits = _top_p_filter(logits, cfg.top_p)
    return torch.softmax(logits, dim=-1)


def fit_vocab(q: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Pad or cut a draft distribution's last dim to the target's vocabulary (padded embedding rows differ by model)."""
    v = q.shape[-1]
    if v == vocab_size:
        return q
    if v > vocab_size:
        q = q[..., :vocab_size]
        return q / q.sum(dim=-1, keepdim=True)
    return torch.nn.functional.pad(q, (0, vocab_size - v))


def draft_q(logits: torch.Tensor, sampling: SamplingConfig, vocab_size: int) -> torch.Tensor:
    """The draft's raw logits (..., V_draft) -> q (..., V): the same transform as p, fitted to the target's vocabulary."""
    return fit_vocab(logits_to_probs(logits, sampling), vocab_size)


_TOP_P_FIRST = 256  # candidates the top-p filter looks at first; widened 4x at a time until the set is found


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask tokens outside the smallest most-likely set whose mass reaches top_p.

    A token is dropped when the mass of the tokens ranked above it already reaches top_p (the top token
    always stays). Only the leading candidates are ranked (topk), widened until the last one is dropped in
    every row, so every token after it is too. On the default pair's own logits (the last 5 positions of three
    presets' prompts, temperature 0.8, top-p 0.95; a 2-core AMX Xeon) the full sort took 61-65 ms a verify pass,
    this 3.8 ms, or 13.9 ms where one row needed 2,713 tokens, with the same tokens kept. The masses are the
    softmax of the whole row, so the set is the full sort's up to the last bit of its denominator (summed in
    another order).
    """
    probs = torch.softmax(logits, dim=-1)
    vocab = logits.shape[-1]
    k = min(vocab, _TOP_P_FIRST)
    while True:
        order = torch.topk(logits, k, dim=-1).indices  # (..., k), most likely first
        ranked = probs.gather(-1, order)
        before = ranked.cumsum(dim=-1) - ranked  # the mass ranked above each candidate
        if k == vocab or bool((before[..., -1] >= top_p).all()):
            break
        k = min(vocab, k * 4)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, before < top_p)
    return logits.masked_fill(~keep, float("-inf"))


@dataclass(frozen=True)
class Verdict:
    """What the target decided about one draft; all plain CPU data except `residual`."""

    n_accepted: int  # length of the accepted prefix of the draft
    next_token: int  # the target's own token appended after the accepted prefix
    next_origin: Origin  # "correction" (from the residual at a rejection) or "bonus" (all accepted)
    accept_probs: tuple[float, ...]  # min(1, p_i(x_i)/q_i(x_i)) for every drafted position
    uniforms: tuple[float, ...]  # u_i drawn for every drafted position; accepted while u_i < accept_prob_i
    residual: torch.Tensor  # (V,) the distribution next_token was drawn from


def verify_draft(
    p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator
) -> Verdict:
    """THE acceptance rule, exact: speculative sampling (Leviathan et al. 2022; Chen et al. 2023).

    Letters never switch in specviz: `p` is always the TARGET, `q` always the DRAFT.
    p: (γ+1, V) target probs at each drafted position and one after; q: (γ, V) draft probs;
    draft_tokens: (γ,) ids drawn from q. Accept x_i with probability min(1, p_i(x_i)/q_i(x_i));
    at the first rejection draw from norm(max(0, p_i - q_i)); if all pass draw a bonus from p_γ.
    """
    gamma = draft_tokens.shape[0]
    idx = torch.arange(gamma, device=p.device)
    p_x = p[idx, draft_tokens]  # (γ,)
    q_x = q[idx, draft_tokens]  # (γ,)
    accept = torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-30)).clamp(max=1.0), torch.zeros_like(p_x))
    u = torch.rand(gamma, generator=generator, device=p.device)  # (γ,)
    rejected = (u >= accept).nonzero()
    n = int(rejected[0]) if rejected.numel() else gamma
    if n < gamma:
        residual = (p[n] - q[n]).clamp_min(0.0)  # (V,)
        total = residual.sum()
        # p == q up to rounding leaves nothing: the rejection then had probability ~0, fall back to p
        residual = residual / total if total > 1e-12 else p[n]
        origin: Origin = "correction"
    else:
        residual, origin = p[gamma], "bonus"
    next_token = sample_from(residual, generator)
    return Verdict(n, next_token, origin, tuple(accept.tolist()), tuple(u.tolist()), residual)


AcceptRule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Verdict]  # verify_draft's signature
RuleName = Literal["exact", "topk"]


@dataclass(frozen=True)
class TopKShortcut:
    """DELIBERATELY WRONG (lossy) rule, for the Same answer lab only: accept x_i whenever it is in p_i's top k.

    On the first rejection the correction is drawn from p itself (no residual), and a bonus from
    p after a fully accepted draft. Tokens the draft likes and the target ranks highly come out
    too often; the lab's goodness-of-fit test catches it. Same signature and letters as verify_draft.
    """

    k: int = 3

    def __call__(self, p: torch.Tensor, q: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator) -> Verdict:
        gamma = draft_tokens.shape[0]
        idx = torch.arange(gamma, device=p.device)
        p_x = p[idx, draft_tokens]  # (γ,)
        kth = torch.topk(p[:gamma], min(self.k, p.shape[-1]), dim=-1).values[:, -1]  # (γ,) k-th largest p
        accept = ((p_x >= kth) & (p_x > 0)).float()  # (γ,) 1 inside the top k, 0 outside
        u = torch.rand(gamma, generator=generator, device=p.device)  # (γ,) drawn only to keep the trace's shape
        rejected = (u >= accept).nonzero()
        n = int(rejected[0]) if rejected.numel() else gamma
        residual = p[n]  # the shortcut: just let the target pick, ignoring what the draft already took
        origin: Origin = "correction" if n < gamma else "bonus"
        return Verdict(n, sample_from(residual, generator), origin, tuple(accept.tolist()), tuple(u.tolist()), residual)


def acceptance_rule(rule: RuleName, k: int = 3) -> AcceptRule:
    """An acceptance rule by name: "exact" (verify_draft) or "topk" (the lossy shortcut, top-k with this k)."""
    if rule == "exact":
        return verify_draft
    if rule == "topk":
        return TopKShortcut(k)
    raise ValueError(f"unknown rule {rule!r}")


def draft_confidence(q: torch.Tensor, x: int, sampling: SamplingConfig, logits: torch.Tensor, row: int) -> float:
    """A drafter's own belief in the token x it drew: q(x) when sampling; when q is one-hot (greedy), the plain
    softmax of its logits at x's row (`row`: where x sits in those logits). The confidence stop of adaptive chains
    reads it, as transformers' assistant_confidence_threshold does."""
    if not sampling.greedy:
        return float(q[x])
    return float(torch.softmax(logits, dim=-1)[row])


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one id from a (V,) distribution (a residual's rounding off 1 is fine) by inverting its cumulative sum.

    One uniform from the run's generator, placed in the float64 cumulative sum: the first id whose running total
    passes it, which always has a weight above 0. torch.multinomial draws the same law with an exponential for every
    entry (152k a token over Qwen's vocabulary: ~4 ms on a CPU core, most of a sampled lab's time). A one-hot row
    (every greedy step) has only one possible draw: its argmax, with no draw at all.
    """
    top, arg = probs.max(dim=-1)
    if top >= 1.0:
        return int(arg)
    total = probs.cumsum(-1, dtype=torch.float64)
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
    return int(torch.searchsorted(total, u * total[-1], right=True).clamp_max(probs.shape[-1] - 1))
