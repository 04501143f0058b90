"""Training the EAGLE-style head on what the target itself says: its continuations, its features and its next-token laws.

The data are the target's own sampled continuations of some prompts (the head must learn what this
target says, not what people wrote), read back in one target pass each for its last-layer features
and its p. A step takes a window of one sequence: every pair (feature at i, token i+1) in it, and
the loss is the cross-entropy of the head's guess of token i+2 against the target's p there (over
the draft vocabulary: the mass outside it cannot be guessed) plus EAGLE's regression of the guessed
feature on the real one. Seeded: one generator picks the windows (the head's init is seeded where it is built).
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


def _window_guess(head: EagleHead, data: Sequences, s: int, a: int, b: int) -> tuple[torch.Tensor, ...]:
    """The head's guesses over pairs i = a..b-3 of sequence s, with what they are compared to: (f̂, f real, p)."""
    ids, f = data.ids[s], data.feats[s]
    i = torch.arange(a, b - 2)
    guessed = head(f[i].float(), ids[i + 1], i)  # (n, d)
    real = f[i + 1].float()
    if data.probs is not None:
        p = data.probs[s][i + 1]
    else:
        with torch.no_grad():  # the target's own law over the N ids, from its feature and its head rows
            p = torch.softmax(head.logits(real).float(), dim=-1)
    return guessed, real, p


def step_loss(head: EagleHead, data: Sequences, windows: Sequence[tuple[int, int, int]], feature_weight: float) -> torch.Tensor:
    """The loss over the windows' pairs: guessing the next token (cross-entropy against the target's p) and its feature."""
    parts = [_window_guess(head, data, *w) for w in windows]
    guessed, real, p = (torch.cat(x) for x in zip(*parts))
    log_q = torch.log_softmax(head.logits(guessed).float(), dim=-1)  # (n, N)
    ce = -(p * log_q).sum(-1).mean()
    regression = nn.functional.smooth_l1_loss(guessed.float(), real)
    return ce + feature_weight * regression


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
            loss = step_loss(head, data, windows, cfg.feature_weight)
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
def expected_acceptance(head: EagleHead, data: Sequences, skip: int = 0,
                        p_of: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """The head's first guess over the pairs of `data` from position `skip` on: (sampled acceptance, greedy agreement).

    Sampled: the mean over positions of sum min(p, q), q the head's softmax over its N ids (0 elsewhere) and p the
    target's law there over the whole vocabulary (`data.probs`, or `p_of(features)`: p at the N ids, normalised over
    all V). Greedy: how often the head's top id is the target's top id among the N ids.
    """
    total, agree, n = 0.0, 0, 0
    for s in range(len(data.ids)):
        ids, f = data.ids[s], data.feats[s]
        length = _length(data, s)  # pairs 0..length-3: the last one's target is the last feature row
        i = torch.arange(skip, length - 2)
        if len(i) == 0:
            continue
        pos = torch.arange(length - 2)
        q = torch.softmax(head.logits(head(f[:length - 2].float(), ids[1:length - 1], pos)).float(), -1)[i]
        p = data.probs[s][i + 1] if data.probs is not None else p_of(f[i + 1].float())
        total += float(torch.minimum(p, q).sum())
        agree += int((q.argmax(-1) == p.argmax(-1)).sum())
        n += len(i)
    return total / max(n, 1), agree / max(n, 1)
