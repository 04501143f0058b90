"""Watch it work: one speculative run and its target-only baseline, keyed by everything that changes them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specviz.core.drafters import make_drafter
from specviz.core.engine import autoregressive_program, speculative_program
from specviz.core.metrics import Comparison, compare
from specviz.core.trace import Generation, RoundTrace
from specviz.host import CpuSample, others_cores
from specviz.serve.batch import SharedRun, Sharing
from specviz.settings import Settings

# RoundTrace is the record the page replays: the page takes it from here, not from core
__all__ = ["BUSY_OTHERS", "NOISY_STEPS", "AloneRecord", "OthersUse", "RoundTrace", "RunRef", "SharedServer", "baseline_run",
           "comparison", "others_while", "run_ref", "speculative_run", "step_spread"]


@dataclass(frozen=True)
class RunRef:
    """What the page keeps in session_state about a run: keys into the shared runner, nothing heavy."""

    spec_key: tuple[Any, ...]  # the speculative run: its rounds stream in and are replayed
    plain_key: tuple[Any, ...]  # the target-only baseline it is compared with
    prompt: str
    settings: Settings

    @property
    def keys(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self.spec_key, self.plain_key


def run_ref(pair: str, prompt: str, s: Settings) -> RunRef:
    """The keys of a run with these settings (γ and the drafter do not change the baseline, so it is shared)."""
    return RunRef(("watch.spec", pair, prompt, s.drafter, s.generation_config()),
                  ("watch.plain", pair, prompt, s.baseline_config()), prompt, s)


def speculative_run(pair: Any, prompt_ids: Sequence[int], s: Settings) -> SharedRun:
    """The speculative run, for the server's batch: yields a RoundTrace per round, returns the Generation."""
    drafter = make_drafter(s.drafter, pair.draft, adaptive=s.adaptive)
    return SharedRun(speculative_program(pair.target, drafter, pair.tokenizer, list(prompt_ids), s.generation_config(),
                                         pair.eos_ids), pair.target)


def baseline_run(pair: Any, prompt_ids: Sequence[int], s: Settings) -> SharedRun:
    """The target alone, one token per step, with the same decoding: the run the speed-up is measured against.

    It shares the batch with its speculative run (both are submitted together), so both are timed
    under the same sharing."""
    return SharedRun(autoregressive_program(pair.target, pair.tokenizer, list(prompt_ids), s.baseline_config(),
                                            pair.eos_ids), pair.target)


def comparison(spec: Generation | None, plain: Generation | None) -> Comparison | None:
    """The run's one Comparison record (speed-up, α, c, expected figures, identity) once both runs are done."""
    return compare(spec, plain) if spec is not None and plain is not None else None


# ------------------------------------------------------------------------------------------
# A run on a shared server: how many runs shared its passes, and the pair's figure alone
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OthersUse:
    """What other programs (not this server: other pupils' runs are its own) used of the CPUs while both runs were timed."""

    cores: float  # CPUs they kept busy on average
    cpus: int  # of how many


@dataclass(frozen=True)
class SharedServer:
    """What the page says about sharing once both runs are done."""

    runs_per_pass: float  # mean runs in the target passes of this run and its baseline, both included (2 = nobody else)
    most: int  # the most runs one of those passes served
    alone_speedup: float | None  # the latest speed-up of the same pair and settings measured while no other pupil ran
    alone_prompt: str | None  # the prompt of that measurement
    disturbed: float | None = None  # the baseline's step-time spread, where it says the machine was busy (else None)
    others: OthersUse | None = None  # what other programs used of the CPUs, where it says the machine was busy (else None)

    @property
    def busy(self) -> bool:
        """Something else used the machine while the runs were timed (by either sign): the speed-up is uncertain."""
        return self.disturbed is not None or self.others is not None


def _pair_settings(pair: str, s: Settings) -> tuple[Any, ...]:
    return pair, s.drafter, s.gamma, s.adaptive, s.sampling.mode


# Spread of a target-only run's steps (slowest quarter's bound ÷ fastest quarter's) above which something else used
# the machine while it was timed. Alone on a quiet machine its steps differ by a few % (the context grows); a busy
# laptop (a video call, a projector's driver, a CPU hog on one core) stretches some steps 2-3 times.
NOISY_STEPS = 1.5


# CPU cores other programs may keep busy while a run is timed before it counts as disturbed. A steady hog on one core
# slows the run and its baseline alike and evenly (the spread above missed it: a page figure of 0.77× with no flag);
# the pupil's own browser redrawing this page is the most other programs use on a quiet machine. Measured on this
# 2-core machine (others' cores = host.others_cores of two host.cpu_sample()s; the server's own /proc/PID/stat time
# taken off where a browser shows the page, as in real use it is the server's own):
#   idle, 10 s windows of `python -c "import time; from specviz import host; a = host.cpu_sample(); time.sleep(10);
#   print(host.others_cores(a, host.cpu_sample()))"`: 0.00-0.03;
#   headless Chromium (started as tests/test_browser.py does) playing this page: tiny pair 0.21-0.42, 0.66 in the first
#   10 s (page load, lanes streaming in, speed=fastest); qwen-coder, from Play to both runs done: 0.60-0.61;
#   `python -c "while True: pass"`: 1.00 on an idle machine, 0.98 during a qwen-coder run, 1.02-1.03 with the browser
#   during one (the hog itself gets 0.55 there: it shares the cores with the run's threads).
BUSY_OTHERS = 0.75


def others_while(*spans: tuple[CpuSample, CpuSample] | None) -> OthersUse | None:
    """Others' CPU from the first run's start to the last one's end (None unless every run has both samples, or over
    too short a window to tell)."""
    if not spans or any(span is None for span in spans):
        return None
    first = min((span[0] for span in spans if span is not None), key=lambda c: c.wall_s)
    last = max((span[1] for span in spans if span is not None), key=lambda c: c.wall_s)
    cores = others_cores(first, last)
    return OthersUse(cores, last.cpus) if cores is not None else None


def step_spread(plain: Generation) -> float | None:
    """Upper ÷ lower quartile of a target-only run's step times (None with too few steps to judge)."""
    steps = sorted(r.verify_ms for r in plain.rounds)
    if len(steps) < 8 or steps[len(steps) // 4] <= 0:
        return None
    return steps[(3 * len(steps)) // 4] / steps[len(steps) // 4]


class AloneRecord:
    """The speed-up each pair and settings gave when its run and baseline had the server to themselves (one per server)."""

    def __init__(self, max_entries: int = 256) -> None:
        self._lock = threading.Lock()
        self._found: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()
        self._max = max_entries

    def shared(self, ref: RunRef, pair: str, spec: Sharing | None, plain: Sharing | None,
               speedup: float | None, plain_run: Generation | None = None,
               others: OthersUse | None = None) -> SharedServer | None:
        """The sharing of a finished run and its baseline; a clean run that had the server alone is remembered.

        With the server to itself, a baseline whose steps spread beyond NOISY_STEPS, or other programs that kept
        more than BUSY_OTHERS cores busy meanwhile (`others`, from others_while), say the machine was busy with
        something else: that speed-up is uncertain, and it is neither remembered nor given a verdict.
        (Sharing a server changes the steps' cost as runs come and go, so both only judge a run alone.)"""
        if spec is None or plain is None:
            return None
        most = max(spec.most, plain.most)
        spread = step_spread(plain_run) if plain_run is not None else None
        disturbed = spread if spread is not None and spread > NOISY_STEPS and most <= 2 else None
        hogged = others if others is not None and others.cores > BUSY_OTHERS and most <= 2 else None
        key = _pair_settings(pair, ref.settings)
        passes = spec.passes + plain.passes
        mean = (spec.runs_total + plain.runs_total) / passes if passes else 1.0
        with self._lock:
            if most <= 2 and speedup is not None and disturbed is None and hogged is None:  # only the run and its baseline
                self._found[key] = (speedup, ref.prompt)
                self._found.move_to_end(key)
                while len(self._found) > self._max:
                    self._found.popitem(last=False)
            alone = self._found.get(key)
        return SharedServer(round(mean, 1), most, alone[0] if alone else None, alone[1] if alone else None, disturbed,
                            hogged)
