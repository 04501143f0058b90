"""Watch it work: one speculative run and its target-only baseline, keyed by everything that changes them."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specviz.bench.timing import NOISY_SPREAD
from specviz.core import drafters
from specviz.core.engine import autoregressive_program, speculative_program
from specviz.core.memory import SOURCE_WORDS, Memory
from specviz.core.metrics import Comparison, compare
from specviz.core.trace import MODEL_HELPER, Generation, RoundTrace
from specviz.host import CpuSample, others_cores
from specviz.serve.batch import SharedRun, Sharing
from specviz.settings import Settings
from specviz.models import drafting

# RoundTrace is the record the page replays: the page takes it from here, not from core
__all__ = ["BUSY_OTHERS", "AloneRecord", "OthersUse", "RoundTrace", "RunRef", "SharedServer", "baseline_run",
           "comparison", "others_while", "remembers", "run_ref", "speculative_run", "step_spread"]


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

    @property
    def asks(self) -> tuple[Any, ...]:
        """The pair, prompt and settings of the run, without whose run it is (what the page compares with its widgets)."""
        return self.spec_key[:5]


def remembers(s: Settings) -> bool:
    """Whether the run's drafter drafts from earlier runs: then each run is its visitor's own, never shared by key."""
    return drafters.spec(s.drafter).remembers


def run_ref(pair: str, prompt: str, s: Settings, run: tuple[str, int] | None = None,
            owner: str | None = None) -> RunRef:
    """The keys of a run with these settings (γ and the drafter do not change the baseline, so it is shared).

    `run`: (visitor, run number) for a drafter that remembers. Its drafts depend on the visitor's earlier runs, so two
    visitors, or one visitor's second Play, must not share one run; None for every other drafter (shared by settings).
    `owner`: the visitor, for a prompt of their own outside a classroom: its runs and plain run are theirs alone (a
    second visitor who typed the same text would otherwise get them at once, and learn that someone had); None shares
    by settings (the presets, and every prompt in a classroom, whose pupils share one server's runs on purpose).
    """
    return RunRef(("watch.spec", pair, prompt, s.drafter, s.generation_config(), run, owner),
                  ("watch.plain", pair, prompt, s.baseline_config(), owner), prompt, s)


def speculative_run(pair: Any, prompt_ids: Sequence[int], s: Settings, memory: Memory | None = None) -> SharedRun:
    """The speculative run, for the server's batch: yields a RoundTrace per round, returns the Generation.

    `memory`: what a remembering drafter drafts from (the visitor's own runs, the class's when allowed, the
    datastore); None gives it the datastore only.
    """
    drafter = drafting.resolve(s.drafter, pair, adaptive=s.adaptive, memory=memory)
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
    plain_timed_at: float | None = None  # the plain run was reused, not run beside this one: when it was (time.time())

    @property
    def busy(self) -> bool:
        """Something else used the machine while the runs were timed (by either sign): the speed-up is uncertain."""
        return self.disturbed is not None or self.others is not None


def _pair_settings(pair: str, s: Settings) -> tuple[Any, ...]:
    return pair, s.drafter, s.gamma, s.adaptive, s.sampling.mode




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


def timed_together(spec: Any, plain: Any) -> bool:
    """Whether a run and its plain twin were computed at the same time (their windows overlap), as a fresh Play makes
    them; False where the plain run was reused from an earlier run of the same prompt and settings."""
    a, b = getattr(spec, "timed", None), getattr(plain, "timed", None)
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def others_during(spec: Any, plain: Any) -> OthersUse | None:
    """What other programs used while the runs were timed: over both runs' window when they ran together; else each
    run's own window, judged alone, the busier one (the hours between a reused plain run and this one never count)."""
    if timed_together(spec, plain):
        return others_while(spec.cpu, plain.cpu)
    alone = [u for u in (others_while(spec.cpu), others_while(plain.cpu)) if u is not None]
    return max(alone, key=lambda u: u.cores) if len(alone) == 2 else None


def others_while(*spans: tuple[CpuSample, CpuSample] | None) -> OthersUse | None:
    """Others' CPU from the first run's start to the last one's end (None unless every run has both samples, or over
    too short a window to tell)."""
    if not spans or any(span is None for span in spans):
        return None
    first = min((span[0] for span in spans if span is not None), key=lambda c: c.wall_s)
    last = max((span[1] for span in spans if span is not None), key=lambda c: c.wall_s)
    cores = others_cores(first, last)
    return OthersUse(cores, last.cpus) if cores is not None else None


def step_spread(plain: Generation, shared: int = 0) -> float | None:
    """Upper ÷ lower quartile of a target-only run's step times, over the steps it took alone: after its first `shared`
    steps, which were the passes it shared with its twin's verify passes (a step each while both ran). Those are the
    same passes for both runs, so a disturbance there slows both alike; and their sizes differ from round to round (a
    tree's nodes, an adaptive γ), so mixed in they look like a disturbance by themselves (a tree run: 1.8× on a quiet
    machine). None with too few steps to judge (8)."""
    return _quartile_ratio(sorted(r.verify_ms for r in plain.rounds[shared:]))


def _quartile_ratio(steps: list[float]) -> float | None:
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
               others: OthersUse | None = None, plain_timed_at: float | None = None) -> SharedServer | None:
        """The sharing of a finished run and its baseline; a clean run that had the server alone is remembered.

        With the server to itself, a baseline whose steps spread beyond NOISY_SPREAD, or other programs that kept
        more than BUSY_OTHERS cores busy meanwhile (`others`, from others_while), say the machine was busy with
        something else: that speed-up is uncertain, and it is neither remembered nor given a verdict.
        (Sharing a server changes the steps' cost as runs come and go, so both only judge a run alone.)
        `plain_timed_at`: the plain run was reused from an earlier run (when it was timed): the caption says so, and
        such a pair is not remembered as this server's free figure."""
        if spec is None or plain is None:
            return None
        most = max(spec.most, plain.most)
        # its passes shared with its twin (each adds two runs to its total, one pass): its first steps (step_spread)
        shared_steps = max(0, plain.runs_total - plain.passes)
        spread = step_spread(plain_run, shared_steps) if plain_run is not None else None
        disturbed = spread if spread is not None and spread > NOISY_SPREAD and most <= 2 else None
        hogged = others if others is not None and others.cores > BUSY_OTHERS and most <= 2 else None
        key = _pair_settings(pair, ref.settings)
        passes = spec.passes + plain.passes
        mean = (spec.runs_total + plain.runs_total) / passes if passes else 1.0
        with self._lock:
            clean = disturbed is None and hogged is None and plain_timed_at is None
            if most <= 2 and speedup is not None and clean:  # only the run and its baseline, timed together
                self._found[key] = (speedup, ref.prompt)
                self._found.move_to_end(key)
                while len(self._found) > self._max:
                    self._found.popitem(last=False)
            alone = self._found.get(key)
        return SharedServer(round(mean, 1), most, alone[0] if alone else None, alone[1] if alone else None, disturbed,
                            hogged, plain_timed_at)


# ------------------------------------------------------------------------------------------
# The page's sentences: what a run, its baseline, the server and the race say, in each level's words
# ------------------------------------------------------------------------------------------


def run_words(generation: Generation | None, running: bool, rounds_done: int, d1: bool, L: Any) -> str | None:
    """One line on a running or finished run (None while it is queued or failed: the job's own status says that)."""
    if running:
        return (f":material/settings: {L['thinking'].capitalize()} "
                f"({L['round_name'].format(n=rounds_done + 1).lower()} is being computed; "
                f"the lanes replay the {'turns' if d1 else 'rounds'} already done)")
    if generation is None:
        return None
    g = generation
    done = (f":material/check_circle: Finished: {len(g.tokens)} {L['tokens']} in {g.target_calls} big-model turns." if d1 else
            f":material/check_circle: Run complete: {len(g.tokens)} tokens in {g.target_calls} target calls "
            f"({'stopped at end-of-text' if g.stop_reason == 'eos' else 'reached max new tokens'}).")
    return done + " The animation replays the recorded rounds."


def measuring_words(made: int, rounds: int, base: int, max_new_tokens: int, d1: bool, L: Any) -> str:
    """The one line the page shows while both runs are timed."""
    if d1:
        return (f"Timing both: with the helper {made}/{max_new_tokens} {L['tokens']} in {rounds} big-model turns; "
                f"the big model alone {base}/{max_new_tokens}.")
    return (f"Timing both runs: speculative {made}/{max_new_tokens} tokens in {rounds} rounds; "
            f"plain decoding {base}/{max_new_tokens} tokens.")


def still_words(d1: bool) -> str:
    """Why the page keeps still while the runs are timed."""
    if d1:
        return "The page waits quietly while the computer times both, so that drawing does not slow them down. Then it plays."
    return ("The page keeps still while both runs are timed, so that drawing it cannot slow them; the rounds replay "
            "from the recording as soon as both are done (at measured speed in the race below).")


def baseline_words(queued: bool, ahead: int, made: int, max_new_tokens: int) -> str:
    """Where the target-only baseline stands while it is not done: waiting its turn, or being measured."""
    if queued:
        return (":material/timer: The plain run for comparison waits until the runs queued before it are done"
                + (f" ({ahead} to go)." if ahead > 0 else "."))
    return f":material/timer: Measuring plain decoding for comparison… {made}/{max_new_tokens}"


def busy_reason(shared: SharedServer) -> str:
    """What said the machine was busy: other programs' CPU, the plain run's step spread, or both."""
    reasons = []
    if shared.others is not None:
        reasons.append(f"other programs used {shared.others.cores:.1f} of the {shared.others.cpus} cores while they ran "
                       f"(this page in a browser takes under {BUSY_OTHERS:.2g})")
    if shared.disturbed is not None:
        reasons.append(f"the plain run's steps varied by {shared.disturbed:.1f}× between its faster and slower quarters "
                       f"(a quiet machine stays within {NOISY_SPREAD:.1f}×)")
    return " and ".join(reasons)


def busy_warning(shared: SharedServer) -> str:
    """The warning a disturbed timing earns (D2 and D5)."""
    return (f"The machine was busy while these runs were timed: {busy_reason(shared)}, so this speed-up is "
            "uncertain. Press **Play** again when the computer is quiet (close video calls and other heavy programs).")


def sharing_words(shared: SharedServer, level: str, shown_prompt: str) -> str | None:
    """How many runs shared this run's target passes and how both were timed; (D5) the pair's figure on a free server.
    `shown_prompt`: the remembered prompt, already made safe to echo."""
    if shared.plain_timed_at is not None:
        at = time.strftime("%H:%M", time.localtime(shared.plain_timed_at))
        if level == "d1":
            return f"The big model alone was timed earlier, at {at}, on this same text, and its time is used again."
        return (f"The plain run was not run beside this one: it was timed at {at} for the same prompt and settings "
                "(its tokens do not depend on the helper) and is reused here, so the two were timed at different "
                "moments.")
    if level == "d1":
        if shared.most > 2:  # only a busy server needs saying: the words of the busy-server lesson
            return (f"The big model was also busy with other pupils' writing (up to {shared.most - 2} more at once), "
                    "so checking the helper's guesses was not free this time.")
        return None
    if shared.most <= 1:
        line = ("This server gives every run a big-model pass of its own (its target was not found to give the same "
                "bits in shared passes), so this run and its plain twin took turns with any other runs.")
    elif shared.most == 2:
        line = ("The server had nothing else to do: this run and its plain twin shared the big model's passes only "
                "with each other.")
    else:
        line = (f"A shared server: each big-model pass of this run and its plain twin served **{shared.runs_per_pass:.1f} "
                f"runs** at once on average (at most {shared.most}), other pupils' runs included.")
    if level == "d5":
        line += (" Both runs are timed by the passes they took part in (a shared pass counts in full for each run in "
                 "it; waiting for other runs' draft passes does not count), so the speed-up compares them under the "
                 "same sharing.")
        if shared.most > 2:  # a free-server figure is only worth showing beside a shared one
            line += (f" On this server with nobody else running, these settings gave **{shared.alone_speedup:.2f}×** "
                     f"(prompt: {shown_prompt[:60]})." if shared.alone_speedup else
                     " This server has not yet run these settings with nobody else running, so there is no "
                     "free-server figure to put beside it.")
    return line


def same_text_words(spec: Generation, plain: Generation, level: str) -> tuple[str, str]:
    """The verdict on the two texts: ("success" | "warning" | "info", the sentence)."""
    if not spec.config.sampling.greedy:
        return "info", ("Sampling: both runs follow the target's probabilities, but the random draws fall differently, "
                        "so the two texts can differ. Same seed and settings replay a run exactly.")
    if spec.tokens == plain.tokens:
        return "success", ("The helper did not change a single word: the big model alone wrote exactly the same text."
                           if level == "d1" else
                           "Greedy check: the speculative text is token-for-token identical to the target alone.")
    n = next((i for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens)) if a != b), min(len(spec.tokens), len(plain.tokens)))
    return "warning", (f"The texts differ from token {n + 1} on. Both come from the target, but a pass that scores several "
                       "tokens does its floating-point sums in a different order than a one-token pass, which can flip a "
                       "near-tie between the two most likely tokens.")


def race_caption(started: bool, now_ms: float, level: str) -> str:
    """The line under the race: how it is replayed."""
    hint = "Press **Start the race**. " if not started else ""
    clock = f":material/timer: {now_ms / 1000:.1f} s — " if level != "d1" else ""
    return (f"{hint}{clock}replayed at measured speed (the two runs were computed together, each timed by the passes it "
            "took part in).")


def no_curve_words(drafter: str) -> str | None:
    """Why Leviathan's curves are not drawn for this run's drafter (None: they apply)."""
    if drafters.spec(drafter).leviathan:
        return None
    return (f"These curves describe a chain of γ guesses. A run of the {drafters.spec(drafter).title} has no such curve "
            "here: read its tokens per target call and its pass cost above.")


def memory_words(class_wide: bool) -> str:
    """What a remembering drafter may draft from on this server, said before a run (the operator chose class-wide or not)."""
    if class_wide:
        return ("**Class-wide memory is on** (the server's operator chose it): the helper drafts from this text, your "
                "earlier runs, every other visitor's earlier runs and the datastore, so words another pupil typed can "
                "appear among its guesses.")
    return ("The helper drafts from this text, your own earlier runs on this model pair and the datastore, never "
            "from other visitors' runs. Press **Play** again once a run has ended: the next run remembers it.")


def helper_sentence(r: RoundTrace) -> str | None:
    """Which helper drafted a round and, for a memory draft, where its match was found (None: one helper only)."""
    if r.memory_source:
        where = SOURCE_WORDS.get(r.memory_source, r.memory_source)
        return (f"The memory drafted this round: the text's last {r.match_length} tokens also stood in {where}, "
                "and it proposed what came next there.")
    if r.helper == MODEL_HELPER:
        return "The memory had no confident match, so the small draft model drafted this round."
    return None
