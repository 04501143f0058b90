"""Training the EAGLE-style head on what the target itself says: its continuations, its features and its next-token laws.

The data are the target's own sampled continuations of some prompts (the head must learn what this
target says, not what people wrote), read back in one target pass each for its last-layer features
and its p. A step takes a window of one sequence: every pair (feature at i, token i+1) in it, and
the loss is the cross-entropy of the head's guess of token i+2 against the target's p there (over
the draft vocabulary: the mass outside it cannot be guessed) plus EAGLE's regression of the guessed
feature on the real one. Seeded: one generator picks the windows (the head's init is seeded where it is built).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from specviz.core.draft_vocab import DraftVocab
from specviz.core.head import EagleHead


@dataclass(frozen=True, eq=False)
class Sequences:
    """What the target said and thought: per sequence its ids (T,), features (T, d) and p over the draft vocabulary (T, N)."""

    ids: tuple[torch.Tensor, ...]
    feats: tuple[torch.Tensor, ...]
    probs: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class TrainConfig:
    """One training run's settings (recorded in the head's recipe)."""

    steps: int = 300  # optimizer steps
    lr: float = 3e-3  # AdamW's learning rate (cosine-decayed to a tenth)
    window: int = 64  # pairs per step: a slice of one sequence
    feature_weight: float = 0.1  # EAGLE's feature regression beside the distribution loss
    seed: int = 0  # the order of windows (the head's init is seeded by whoever builds it)


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


def _window(data: Sequences, gen: torch.Generator, width: int) -> tuple[int, int, int]:
    """A random slice [a, b) of a random sequence long enough to hold a pair and its target (b - a >= 3)."""
    usable = [i for i, t in enumerate(data.ids) if len(t) >= 3]
    s = usable[int(torch.randint(len(usable), (1,), generator=gen))]
    length = len(data.ids[s])
    a = int(torch.randint(max(1, length - width - 1), (1,), generator=gen))
    return s, a, min(length, a + width + 2)


def step_loss(head: EagleHead, data: Sequences, s: int, a: int, b: int, feature_weight: float) -> torch.Tensor:
    """The loss over the pairs i = a..b-3 of sequence s: guessing token i+2 (the target's p at i+1) and feature i+1."""
    ids, f, p = data.ids[s], data.feats[s], data.probs[s]
    i = torch.arange(a, b - 2)
    guessed = head(f[i], ids[i + 1], i)  # (n, d)
    log_q = torch.log_softmax(head.logits(guessed), dim=-1)  # (n, N)
    ce = -(p[i + 1] * log_q).sum(-1).mean()
    regression = nn.functional.smooth_l1_loss(guessed, f[i + 1])
    return ce + feature_weight * regression


def train(head: EagleHead, data: Sequences, cfg: TrainConfig,
          progress: Callable[[int, float], None] | None = None) -> list[float]:
    """Train the head's own tensors in place; returns the loss of every step (progress: called with step, loss)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    params = head.trainable()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps, eta_min=cfg.lr / 10)
    losses = []
    head.train()
    for step in range(cfg.steps):
        loss = step_loss(head, data, *_window(data, gen, cfg.window), cfg.feature_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, losses[-1])
    head.eval()
    return losses


@torch.inference_mode()
def expected_acceptance(head: EagleHead, data: Sequences, skip: int = 0) -> float:
    """The sampled rule's acceptance of the head's first guess, averaged over the pairs of `data` from position `skip` on:
    sum over tokens of min(p, q), q the head's softmax over its N ids (0 elsewhere), p the target's law there."""
    total, n = 0.0, 0
    for ids, f, p in zip(data.ids, data.feats, data.probs):
        i = torch.arange(skip, len(ids) - 2)
        if len(i) == 0:
            continue
        q = torch.softmax(head.logits(head(f[: len(ids) - 2], ids[1 : len(ids) - 1], torch.arange(len(ids) - 2))), -1)[i]
        total += float(torch.minimum(p[i + 1], q).sum())
        n += len(i)
    return total / max(n, 1)
