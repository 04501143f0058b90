"""Animation frames of recorded rounds, the text so far, running figures and the race clock (pure data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specviz.core.trace import RoundTrace
from specviz.core.metrics import acceptance_drafted, tokens_per_target_call

Phase = Literal["draft", "verify", "final"]
SegmentKind = Literal["accepted", "correction", "bonus", "target", "pending"]


def verdict_count(r: RoundTrace) -> int:
    """How many verdicts the sweep shows: every accepted token plus the first rejected one."""
    k = len(r.draft_ids)
    return min(k, r.n_accepted + 1) if k else 0


def round_frames(r: RoundTrace) -> int:
    """Frames of one round: each guess appears, each verdict sweeps in, then the target's token."""
    return len(r.draft_ids) + verdict_count(r) + 1


def total_frames(rounds: Sequence[RoundTrace]) -> int:
    return sum(round_frames(r) for r in rounds)


def round_end_frame(rounds: Sequence[RoundTrace], i: int) -> int:
    """The global frame at which round i is fully shown."""
    return sum(round_frames(r) for r in rounds[: i + 1]) - 1


@dataclass(frozen=True)
class Cursor:
    """Where the animation is: round `round`, frame `step` inside it."""

    round: int
    step: int
    frame: int  # global frame number

    def complete(self, rounds: Sequence[RoundTrace]) -> bool:
        return self.step >= round_frames(rounds[self.round]) - 1


def locate(rounds: Sequence[RoundTrace], frame: int) -> Cursor | None:
    """The cursor of a global frame (clipped to what exists); None while there are no rounds."""
    if not rounds:
        return None
    frame = max(0, min(frame, total_frames(rounds) - 1))
    left = frame
    for i, r in enumerate(rounds):
        n = round_frames(r)
        if left < n:
            return Cursor(i, left, frame)
        left -= n
    last = len(rounds) - 1
    return Cursor(last, round_frames(rounds[last]) - 1, frame)


@dataclass(frozen=True)
class LaneState:
    """How much of one round's lane is visible at a step."""

    drafts_shown: int  # guesses visible so far
    verdicts_shown: int  # verdicts (✓/✗) visible so far
    final_shown: bool  # the target's own token visible
    phase: Phase


def lane_state(r: RoundTrace, step: int) -> LaneState:
    k, v = len(r.draft_ids), verdict_count(r)
    if step < k:
        return LaneState(step + 1, 0, False, "draft")
    if step < k + v:
        return LaneState(k, step - k + 1, False, "verify")
    return LaneState(k, v, True, "final")


def full_lane(r: RoundTrace) -> LaneState:
    return lane_state(r, round_frames(r) - 1)


@dataclass(frozen=True)
class Segment:
    """A piece of the text so far and where it came from."""

    text: str
    kind: SegmentKind
    round: int


def round_segments(r: RoundTrace, state: LaneState) -> list[Segment]:
    """The text one round has added at a lane state (pending guesses included, rejected ones dropped)."""
    out: list[Segment] = []
    for i in range(state.drafts_shown):
        if i < state.verdicts_shown:
            if not r.accepted[i]:
                break  # the first rejection: this guess and everything after it is thrown away
            out.append(Segment(r.draft_texts[i], "accepted", r.index))
        else:
            out.append(Segment(r.draft_texts[i], "pending", r.index))
    if state.final_shown:
        out.append(Segment(r.next_text, r.next_origin, r.index))
    return out


def text_segments(rounds: Sequence[RoundTrace], cursor: Cursor | None) -> list[Segment]:
    """The generated text up to the cursor, token by token, each tagged with its origin."""
    if cursor is None:
        return []
    out: list[Segment] = []
    for r in rounds[: cursor.round]:
        out.extend(round_segments(r, full_lane(r)))
    current = rounds[cursor.round]
    out.extend(round_segments(current, lane_state(current, cursor.step)))
    return out


def round_ms(r: RoundTrace) -> float:
    """Wall time of one round as recorded: drafting plus the target's verify pass."""
    return r.draft_ms + r.verify_ms


@dataclass(frozen=True)
class RunningPoint:
    """The running figures after one round."""

    round: int  # 1-based, for display
    acceptance: float | None  # accepted / drafted so far
    tokens_per_call: float  # new tokens per target pass so far
    ms_per_token: float  # speculative ms per new token so far (from round timings)
    speedup: float | None  # baseline ms per token / ms_per_token, once the baseline is measured


def baseline_ms_per_token(baseline_rounds: Sequence[RoundTrace]) -> float | None:
    """Plain decoding's ms per token from its steps (None until there is one)."""
    if not baseline_rounds:
        return None
    return sum(round_ms(r) for r in baseline_rounds) / sum(len(r.new_ids) for r in baseline_rounds)


def running_points(rounds: Sequence[RoundTrace], base_ms_per_token: float | None) -> list[RunningPoint]:
    """Acceptance, tokens per target call and speed-up after every round."""
    points: list[RunningPoint] = []
    ms = tokens = 0.0
    for i, r in enumerate(rounds):
        ms += round_ms(r)
        tokens += len(r.new_ids)
        per_token = ms / tokens
        seen = rounds[: i + 1]
        speedup = base_ms_per_token / per_token if base_ms_per_token and per_token > 0 else None
        points.append(RunningPoint(i + 1, acceptance_drafted(seen), tokens_per_target_call(seen) or 0.0, per_token, speedup))
    return points


@dataclass(frozen=True)
class RaceTimeline:
    """When each token of a run appeared, measured from the start of decoding."""

    times_ms: tuple[float, ...]  # end time of each round
    tokens: tuple[int, ...]  # tokens produced by the end of each round
    texts: tuple[tuple[str, ...], ...]  # the texts each round added

    @property
    def total_ms(self) -> float:
        return self.times_ms[-1] if self.times_ms else 0.0

    def at(self, t_ms: float) -> tuple[int, int]:
        """(rounds finished, tokens produced) by time t."""
        done = sum(1 for t in self.times_ms if t <= t_ms)
        return done, (self.tokens[done - 1] if done else 0)

    def text_at(self, t_ms: float) -> str:
        done, _ = self.at(t_ms)
        return "".join("".join(parts) for parts in self.texts[:done])


def race_timeline(rounds: Sequence[RoundTrace], max_tokens: int | None = None) -> RaceTimeline:
    """The timeline of one run from its recorded round timings (tokens cut at the run's length)."""
    times, counts, texts = [], [], []
    t = 0.0
    n = 0
    for r in rounds:
        t += round_ms(r)
        parts = tuple(r.draft_texts[: r.n_accepted]) + (r.next_text,)
        room = len(parts) if max_tokens is None else max(0, max_tokens - n)
        parts = parts[:room]
        n += len(parts)
        times.append(t)
        counts.append(n)
        texts.append(parts)
    return RaceTimeline(tuple(times), tuple(counts), tuple(texts))
