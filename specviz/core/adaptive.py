"""Adaptive draft length: draft long while drafting pays, draft nothing while it does not."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specviz.core.trace import RoundTrace


@dataclass(frozen=True)
class AdaptiveGamma:
    """Settings of the adaptive policy (a frozen cache key); `new_policy()` makes one per request.

    Two mechanisms, both lossless because they only decide how much to *propose*:
    - the drafter stops early when its own confidence drops (ModelDrafter.min_confidence,
      as transformers' assistant_confidence_threshold and llama.cpp's p-min do), so
      max_gamma is only a ceiling;
    - this policy compares the measured throughput of recent drafting rounds with plain
      target steps and switches drafting off when it loses, probing again after a backoff
      that doubles after every failed probe.
    """

    max_gamma: int = 16  # ceiling of a draft; the confidence stop usually ends it sooner
    window: int = 6  # drafting rounds that make the recent throughput estimate
    min_rounds: int = 3  # drafting rounds measured before judging (one round is too noisy to switch on)
    probe_after: int = 8  # plain rounds before the first probe after drafting was switched off
    max_backoff: int = 64  # longest run of plain rounds between probes
    margin: float = 1.0  # drafting must be at least this many times the plain throughput
    # tokens per drafting round that pay without measuring: here a verify pass costs ~2-2.4 target
    # steps and 16 drafted tokens ~1.1 more, so a round must bring more than 3.5 tokens
    clear_win: float = 4.0

    def new_policy(self) -> "GammaPolicy":
        return GammaPolicy(self)


class GammaPolicy:
    """Per-request state of AdaptiveGamma: call it with the rounds so far to get the next γ."""

    def __init__(self, cfg: AdaptiveGamma) -> None:
        self.cfg = cfg
        self.backoff = cfg.probe_after  # plain rounds to wait after the next failure
        self.plain_goal = 0  # while > 0 drafting is off until this many plain rounds ran
        self.since = 0  # only drafting rounds from this index on are judged (reset at each probe)

    def __call__(self, rounds: Sequence[RoundTrace]) -> int:
        cfg = self.cfg
        if self.plain_goal:
            if _trailing_plain(rounds) < self.plain_goal:
                return 0
            self.plain_goal, self.since = 0, len(rounds)  # probe: judge drafting afresh
            return cfg.max_gamma
        drafting = [r for r in rounds[self.since :] if r.draft_ids][-cfg.window :]
        if len(drafting) < cfg.min_rounds:
            return cfg.max_gamma
        tokens = sum(len(r.new_ids) for r in drafting)
        if tokens / len(drafting) >= cfg.clear_win:
            return cfg.max_gamma  # clearly paying: no need to spend a plain step measuring it
        plain = [r.verify_ms for r in rounds if not r.draft_ids]
        if not plain:
            return 0  # one plain step measures what a target step costs here
        step_ms = statistics.median(plain[-cfg.window :])
        if tokens / sum(r.draft_ms + r.verify_ms for r in drafting) >= cfg.margin / step_ms:
            self.backoff = cfg.probe_after
            return cfg.max_gamma
        # drafting lost: go plain, and wait twice as long after each failed probe in a row
        self.plain_goal = self.backoff
        self.backoff = min(self.backoff * 2, cfg.max_backoff)
        return 0


def _trailing_plain(rounds: Sequence[RoundTrace]) -> int:
    n = 0
    for r in reversed(rounds):
        if r.draft_ids:
            break
        n += 1
    return n
