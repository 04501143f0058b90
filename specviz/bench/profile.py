"""The round profile: one extra run of a method with lap timers on (core.profile), and its table of ms per round.

Why a separate run: the laps cost a little (a clock read per part), so the timed repeats run without them and
their medians stay what the benchmark reports; the profile says where one run's rounds spent their time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specviz.core import profile
from specviz.core.profile import RoundProfile


@dataclass(frozen=True)
class ProfileRow:
    """One method's round profile on one workload and mode (what the report prints)."""

    pair: str
    workload: str
    mode: str
    method: str
    profile: RoundProfile


def profile_run(pair: Any, run: Any) -> RoundProfile:
    """Run `run()` (one of ours: it returns a Generation) with laps on; the profile of its rounds."""
    with profile.recording(pair.target) as laps:
        gen = run()
    return profile.summarise(laps, len(gen.rounds), gen.decode_ms)


ROLE_TITLES = {"draft": "draft passes and sampling", "verify": "the target's pass", "round": "between passes"}


def table_lines(row: ProfileRow, top: int = 8) -> list[str]:
    """Markdown lines: the three parts of a round with their ms, and the largest items inside each."""
    p = row.profile
    lines = [f"**{row.method}** on {row.workload} ({row.mode}): {p.round_ms:.1f} ms per round over {p.rounds} rounds",
             "", "| where | what | ms per round | calls per round |", "| --- | --- | ---: | ---: |"]
    for role in ("draft", "verify", "round"):
        parts = [x for x in p.parts if x.role == role]
        if not parts:
            continue
        total = sum(x.ms for x in parts)
        lines.append(f"| **{ROLE_TITLES[role]}** | all | **{total:.1f}** | |")
        shown = sorted(parts, key=lambda x: -x.ms)[:top]
        for x in shown:
            lines.append(f"| | {x.what} | {x.ms:.2f} | {x.calls:.0f} |")
        rest = sum(x.ms for x in parts) - sum(x.ms for x in shown)
        if rest > 0.005:
            lines.append(f"| | (the rest) | {rest:.2f} | |")
    return lines + [""]


def report_lines(rows: Sequence[ProfileRow]) -> list[str]:
    """The report's section: every profiled method, in order."""
    if not rows:
        return []
    out = ["## Round profile", "",
           "One extra run of each method with lap timers on (not one of the timed repeats): where each millisecond of a "
           "round went. *draft* is the draft's passes (its matmuls by shape, attention, KV cache) and its q and sampling; "
           "*the target's pass* the verify pass the same way and its softmax; *between passes* the acceptance rule, the "
           "cache roll-back, the trace and the loop. *python* is a pass's time that no lap covers.", ""]
    for row in rows:
        out += table_lines(row)
    return out
