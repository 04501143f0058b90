"""Training the EAGLE-style head on what the target itself says: its continuations, its features and its next-token laws.

The data are the target's own sampled continuations of some prompts (the head must learn what this
target says, not what people wrote), read back in one target pass each for its last-layer features
and its p. A step takes a window of one sequence: every pair (feature at i, token i+1) in it, and
the loss is the cross-entropy of the head's guess of token i+2 against the target's p there (over
the draft vocabulary: the mass outside it cannot be guessed) plus EAGLE's regression of the guessed
feature on the real one. Seeded: one generator picks the windows (the head's init is seeded where it is built).

Training-time test (EAGLE-3's remedy, `unroll` > 1): a chain's second guess reads the head's own guessed
feature, not the target's, and a head trained on real features only has never seen one. So a step runs the
head `unroll` times over each window: pass j reads, at every pair, what pass j-1 guessed one pair earlier, and
attends exactly as a chain's j-th draft step would (the real pairs up to where the chain began, then the
guessed pairs on its own way down). Each pass is scored against the same targets; later passes weigh 0.8^j.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specviz.core.draft_vocab import DraftVocab
from specviz.core.head import EagleHead


@dataclass(frozen=True, eq=False)
class Sequences:
    """What the target said and thought: per sequence its ids (T,) and features (T', d), T' <= T (fp16 or fp32).

    probs: p over the draft vocabulary per position (T', N), where a test computed them with the target; None:
    the trainer computes p from the features with the target's own head rows (renormalised over the N ids).
    """

    ids: tuple[torch.Tensor, ...]
    feats: tuple[torch.Tensor, ...]
    probs: tuple[torch.Tensor, ...] | None = None


@dataclass(frozen=True)
class TrainConfig:
    """One training run's settings (recorded in the head's recipe)."""

    steps: int = 300  # optimizer steps
    lr: float = 3e-3  # AdamW's learning rate (cosine-decayed to a tenth)
    window: int = 64  # pairs per window: a slice of one sequence
    batch: int = 1  # windows per step
    feature_weight: float = 0.1  # EAGLE's feature regression beside the distribution loss
    seed: int = 0  # the order of windows (the head's init is seeded by whoever builds it)
    warmup: int = 0  # steps of linear warm-up before the cosine decay (a big first step can throw a fresh head off)
    bf16: bool = False  # autocast the head's arithmetic to bfloat16 (fast where the CPU has bf16 units)
    unroll: int = 1  # passes per window: 1 teacher-forces real features; k > 1 is the training-time test to depth k


@torch.inference_mode()
def collect(target: nn.Module, sequences: Sequence[Sequence[int]], vocab: DraftVocab) -> Sequences:
    """One plain target pass per sequence: its last-layer features (after the final norm) and p over the draft's ids."""
    ids, feats, probs = [], [], []
    for seq in sequences:
        x = torch.tensor([list(seq)])
        out = target(input_ids=x, output_hidden_states=True)
        ids.append(x[0])
        feats.append(out.hidden_states[-1][0].float())  # (T, d)
        probs.append(torch.softmax(out.logits[0].float(), dim=-1)[:, vocab.ids])  # (T, N)
    return Sequences(tuple(ids), tuple(feats), tuple(probs))


def _length(data: Sequences, s: int) -> int:
    """Positions of sequence s that have both a token and a feature."""
    return min(len(data.ids[s]), len(data.feats[s]) + 1)


def _window(data: Sequences, gen: torch.Generator, width: int) -> tuple[int, int, int]:
    """A random slice [a, b) of a random sequence long enough to hold a pair and its target (b - a >= 3)."""
    usable = [i for i in range(len(data.ids)) if _length(data, i) >= 3]
    s = usable[int(torch.randint(len(usable), (1,), generator=gen))]
    length = _length(data, s)
    a = int(torch.randint(max(1, length - width - 1), (1,), generator=gen))
    return s, a, min(length, a + width + 2)


def _targets(head: EagleHead, data: Sequences, s: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the guesses over pairs i = a..b-3 of sequence s are compared to: the real next feature and p there."""
    i = torch.arange(a + 1, b - 1)
    real = data.feats[s][i].float()
    if data.probs is not None:
        return real, data.probs[s][i]
    with torch.no_grad():  # the target's own law over the N ids, from its feature and its head rows
        return real, torch.softmax(head.logits(real).float(), dim=-1)


def chain_sees(n: int, depth: int) -> torch.Tensor:
    """What pass `depth` (0: real features) of an n-pair window attends to among the depth+1 passes' entries.

    A chain's draft step `depth` at pair t began at pair t - depth: it sees the real pairs up to there (pass 0)
    and the pair pass m guessed at t - depth + m on its way down (m = 1..depth, the last one itself). A row with
    no chain behind it (t < depth) is never scored: it sees at least itself, so its softmax is defined, and no
    scored row attends to it.
    """
    t = torch.arange(n)
    sees = torch.zeros(n, (depth + 1) * n, dtype=torch.bool)
    sees[:, :n] = t[None, :] <= (t - depth)[:, None]  # pass 0: the real pairs up to the chain's start
    for m in range(1, depth + 1):
        u = t - depth + m  # the pair pass m guessed on this row's chain
        ok = u >= 0
        sees[t[ok], m * n + u[ok]] = True
    return sees


def unrolled_guesses(head: EagleHead, data: Sequences, s: int, a: int, b: int, unroll: int) -> list[torch.Tensor]:
    """The head's guesses f̂ over pairs i = a..b-3 of sequence s, one (n, d) per pass; pass j's first j rows are
    not a chain's (nothing guessed before them) and are left out of any score."""
    ids, f = data.ids[s], data.feats[s]
    i = torch.arange(a, b - 2)
    tokens = ids[i + 1]
    feats = f[i].float()
    if unroll == 1:
        return [head(feats, tokens, i)]
    cache = head.new_cache()
    out = []
    for depth in range(unroll):
        guessed = head(feats, tokens, i, cache, sees=chain_sees(len(i), depth) if depth else None)
        out.append(guessed)
        feats = torch.cat([guessed[:1], guessed[:-1]])  # pair t reads what was guessed at t - 1 (row 0: unscored)
    return out


def pass_weights(unroll: int) -> list[float]:
    """The weight of each pass's loss (EAGLE-3's 0.8^j), normalised to sum to 1."""
    w = [0.8 ** j for j in range(unroll)]
    return [x / sum(w) for x in w]


def step_loss(head: EagleHead, data: Sequences, windows: Sequence[tuple[int, int, int]], feature_weight: float,
              unroll: int = 1) -> torch.Tensor:
    """The loss over the windows' pairs: guessing the next token (cross-entropy against the target's p) and its
    feature, for each pass of the training-time test (one pass: teacher forcing)."""
    targets = [_targets(head, data, *w) for w in windows]
    guesses = [unrolled_guesses(head, data, *w, unroll) for w in windows]
    loss = torch.zeros(())
    for depth, weight in enumerate(pass_weights(unroll)):
        guessed = torch.cat([g[depth][depth:] for g in guesses])
        real = torch.cat([t[0][depth:] for t in targets])
        p = torch.cat([t[1][depth:] for t in targets])
        if len(guessed) == 0:
            continue
        log_q = torch.log_softmax(head.logits(guessed).float(), dim=-1)  # (n, N)
        ce = -(p * log_q).sum(-1).mean()
        regression = nn.functional.smooth_l1_loss(guessed.float(), real)
        loss = loss + weight * (ce + feature_weight * regression)
    return loss


def _lr_scale(step: int, cfg: TrainConfig) -> float:
    """The learning rate's multiplier at a step: a linear warm-up, then a cosine decay from 1 to a tenth."""
    warm = min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else 1.0
    return warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, cfg.steps) / cfg.steps)))


@dataclass
class TrainState:
    """Everything a stopped run needs to go on exactly where it was (a checkpoint holds one)."""

    step: int
    losses: list[float]
    head: dict[str, torch.Tensor]
    optimizer: dict
    scheduler: dict
    generator: torch.Tensor


def train(head: EagleHead, data: Sequences, cfg: TrainConfig,
          progress: Callable[[int, float], None] | None = None,
          resume: TrainState | None = None,
          checkpoint: Callable[[TrainState], None] | None = None, every: int = 50) -> list[float]:
    """Train the head's own tensors in place; returns the loss of every step (progress: called with step, loss).

    `resume` continues a checkpointed run; `checkpoint` is handed the state every `every` steps and at the end.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    params = head.trainable()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: _lr_scale(step, cfg))
    losses: list[float] = []
    first = 0
    if resume is not None:
        head.load_state_dict(resume.head, strict=False)
        opt.load_state_dict(resume.optimizer)
        sched.load_state_dict(resume.scheduler)
        gen.set_state(resume.generator)
        losses, first = list(resume.losses), resume.step

    def state(step: int) -> TrainState:
        # copies: the optimizer's state_dict holds its live moment tensors, which the next steps change in place
        return TrainState(step, list(losses), {k: v.clone() for k, v in head.weights().items()},
                          copy.deepcopy(opt.state_dict()), sched.state_dict(), gen.get_state())

    head.train()
    for step in range(first, cfg.steps):
        windows = [_window(data, gen, cfg.window) for _ in range(cfg.batch)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss = step_loss(head, data, windows, cfg.feature_weight, cfg.unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, losses[-1])
        if checkpoint is not None and ((step + 1) % every == 0 or step + 1 == cfg.steps):
            checkpoint(state(step + 1))
    head.eval()
    return losses


@torch.inference_mode()
def acceptance_by_depth(head: EagleHead, data: Sequences, depth: int = 1, skip: int = 0,
                        p_of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[tuple[float, float]]:
    """A chain's guesses 1..depth over the pairs of `data` from position `skip` on: per depth (sampled acceptance,
    greedy agreement), the chain's earlier tokens being the text's (guess j reads the head's own guessed feature).

    Sampled: the mean over positions of sum min(p, q), q the head's softmax over its N ids (0 elsewhere) and p the
    target's law there over the whole vocabulary (`data.probs`, or `p_of(features)`: p at the N ids, normalised over
    all V). Greedy: how often the head's top id is the target's top id among the N ids.
    """
    total, agree, n = [0.0] * depth, [0] * depth, [0] * depth
    for s in range(len(data.ids)):
        length = _length(data, s)  # pairs 0..length-3: the last one's target is the last feature row
        if length < 3:
            continue
        guesses = unrolled_guesses(head, data, s, 0, length, depth)
        guessed_at = torch.arange(1, length - 1)  # the positions whose tokens pairs 0..length-3 guess
        p = data.probs[s][guessed_at] if data.probs is not None else p_of(data.feats[s][guessed_at].float())
        for j, guessed in enumerate(guesses):
            rows = torch.arange(max(skip, j), length - 2)
            if len(rows) == 0:
                continue
            q = torch.softmax(head.logits(guessed[rows]).float(), -1)
            total[j] += float(torch.minimum(p[rows], q).sum())
            agree[j] += int((q.argmax(-1) == p[rows].argmax(-1)).sum())
            n[j] += len(rows)
    return [(t / max(k, 1), g / max(k, 1)) for t, g, k in zip(total, agree, n)]


def expected_acceptance(head: EagleHead, data: Sequences, skip: int = 0,
                        p_of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """The head's first guess (it reads the target's real feature): (sampled acceptance, greedy agreement)."""
    return acceptance_by_depth(head, data, 1, skip, p_of)[0]
